//! What a run keeps in host memory, estimated before it starts. A level's metrics are
//! folded as its requests finish (see [`crate::distribution`]), so what grows is the
//! requests in flight, each holding its tokens' timestamps and its rounds' commits until
//! it finishes; a run sized past the machine is refused at load time instead of being
//! killed by the kernel hours in.

/// Bytes an unfinished request keeps per output token: its timestamp (8), its round's
/// share of the commits, and what growing the vectors leaves spare; measured at about 20
/// over a 100,000-request level.
pub const BYTES_PER_OUTPUT_TOKEN: u64 = 20;
/// Bytes a request keeps whatever its length: the record and its vectors' headers.
pub const BYTES_PER_REQUEST: u64 = 256;
/// What a level's statistics can hold at most, whatever its size: each of the five
/// distributions' exact values before its histogram takes over.
pub const LEVEL_STATISTICS_BYTES: u64 = 5 * 8 * crate::distribution::EXACT_LIMIT as u64;

/// Memory a level holds with `in_flight` requests of up to `output_tokens` tokens each
/// unfinished at once.
pub fn level_bytes(in_flight: u64, output_tokens: u64) -> u64 {
    let per_request =
        BYTES_PER_REQUEST.saturating_add(BYTES_PER_OUTPUT_TOKEN.saturating_mul(output_tokens));
    in_flight
        .saturating_mul(per_request)
        .saturating_add(LEVEL_STATISTICS_BYTES)
}

/// Memory the system says it can give without swapping (Linux's `MemAvailable`), read once
/// per process (a search loads an experiment per candidate); `None` where it cannot be
/// read, and then nothing is refused.
pub fn available_bytes() -> Option<u64> {
    static AVAILABLE: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(read_available)
}

fn read_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `bytes` for people: GB with one decimal, MB below one GB.
pub fn human(bytes: u64) -> String {
    if bytes >= 1_000_000_000 {
        format!("{:.1} GB", bytes as f64 / 1e9)
    } else {
        format!("{:.0} MB", (bytes as f64 / 1e6).ceil())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_is_per_request_in_flight_and_saturates() {
        // 100,000 requests of 200 tokens in flight at once: about 400 MB, plus the level's
        // statistics
        let many = level_bytes(100_000, 200) - LEVEL_STATISTICS_BYTES;
        assert!((400_000_000..=430_000_000).contains(&many), "{many}");
        // the size of the level no longer counts: eight in flight are a few kB
        assert!(level_bytes(8, 200) - LEVEL_STATISTICS_BYTES < 50_000);
        assert_eq!(level_bytes(u64::MAX, 200), u64::MAX);
        assert_eq!(human(425_600_000), "426 MB");
        assert_eq!(human(40_051_200_000), "40.1 GB");
    }

    #[test]
    fn linux_says_what_it_has() {
        if cfg!(target_os = "linux") {
            assert!(available_bytes().is_some_and(|b| b > 0));
        }
    }
}
