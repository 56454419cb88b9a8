//! Whole-or-nothing file writes: a reader never sees half a report.

use std::io::Write;
use std::path::Path;

/// The temporary file's name beside `name`: hidden, and ending in the writer's process id
/// so a later run can tell a crashed writer's leftover from a live one's.
fn temp_name(name: &str, pid: u32) -> String {
    format!(".{name}.tmp-{pid}")
}

/// Writes `bytes` to a temporary file beside `path`, syncs it, then renames it over `path`.
/// A `path` that exists and is not a regular file (a device node, a directory, a pipe) is
/// refused rather than replaced. Leftovers of writers that died (kill -9 between create
/// and rename) are removed first.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Ok(meta) = std::fs::metadata(path) {
        if !meta.is_file() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "it exists and is not a regular file (a device, a directory or a pipe): refusing to replace it",
            ));
        }
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))?
        .to_string_lossy()
        .into_owned();
    remove_dead_writers_temps(dir, &name);
    let tmp = dir.join(temp_name(&name, std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Removes `.NAME.tmp-PID` files beside `name` whose writer is no longer running.
fn remove_dead_writers_temps(dir: &Path, name: &str) {
    let prefix = format!(".{name}.tmp-");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(pid) = file
            .to_str()
            .and_then(|f| f.strip_prefix(prefix.as_str()))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !process_is_running(pid) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(target_os = "linux")]
fn process_is_running(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Without /proc, a leftover is never taken for a dead writer's.
#[cfg(not(target_os = "linux"))]
fn process_is_running(_pid: u32) -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_not_a_regular_file_is_refused_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a-directory");
        std::fs::create_dir(&sub).unwrap();
        let e = write_atomic(&sub, b"{}").unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert!(sub.is_dir());
        let fifo = dir.path().join("a-pipe");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            assert!(write_atomic(&fifo, b"{}").is_err());
            assert!(!std::fs::metadata(&fifo).unwrap().is_file());
        }
        // a regular file is replaced whole
        let file = dir.path().join("r.json");
        write_atomic(&file, b"old").unwrap();
        write_atomic(&file, b"new").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"new");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_dead_writers_leftover_is_removed_and_a_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("r.json");
        // pid 4194304 is above Linux's pid_max: no process has it
        let dead = dir.path().join(temp_name("r.json", 4_194_304));
        let live = dir.path().join(temp_name("r.json", 1));
        let other = dir.path().join(temp_name("other.json", 4_194_304));
        for f in [&dead, &live, &other] {
            std::fs::write(f, b"half a report").unwrap();
        }
        write_atomic(&file, b"{}").unwrap();
        assert!(!dead.exists(), "a dead writer's leftover stays");
        assert!(live.exists(), "pid 1 is running");
        assert!(
            other.exists(),
            "another file's leftover is not ours to remove"
        );
    }
}
