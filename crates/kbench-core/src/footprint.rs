//! What a run keeps in host memory, estimated before it starts. Every level's records stay
//! until the report is written (each output token's timestamp and each round's commit), so
//! a run sized past the machine is refused at load time instead of being killed by the
//! kernel hours in.

/// Bytes a record keeps per output token: its timestamp (8), its round's share of the
/// commits, and what growing the vectors leaves spare; measured at about 20 over a
/// 100,000-request level.
pub const BYTES_PER_OUTPUT_TOKEN: u64 = 20;
/// Bytes a record keeps whatever its length: the record and its vectors' headers.
pub const BYTES_PER_REQUEST: u64 = 256;

/// Records kept by `levels` levels of `requests` requests (warm-up included) of up to
/// `output_tokens` tokens each.
pub fn records_bytes(levels: u64, requests: u64, output_tokens: u64) -> u64 {
    let per_request =
        BYTES_PER_REQUEST.saturating_add(BYTES_PER_OUTPUT_TOKEN.saturating_mul(output_tokens));
    levels.saturating_mul(requests).saturating_mul(per_request)
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
    fn the_estimate_is_per_token_and_saturates() {
        // the 100,000 x 200-token level: about 400 MB
        let one = records_bytes(1, 100_000, 200);
        assert!((400_000_000..=430_000_000).contains(&one), "{one}");
        assert_eq!(records_bytes(7, u64::MAX, 200), u64::MAX);
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
