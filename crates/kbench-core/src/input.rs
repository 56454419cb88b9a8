//! Reading the small text inputs (experiment files, profiles, configs, corpora) with a size
//! bound, so a wrong path to a gigabyte of anything fails at once instead of being read
//! into memory and parsed.

use std::io::Read;
use std::path::Path;

/// Larger than any experiment file, profile, model config or corpus kbench reads.
pub const TEXT_INPUT_LIMIT: u64 = 16 << 20;

/// The file as UTF-8 text, refused (as `InvalidData`) above [`TEXT_INPUT_LIMIT`].
pub fn read_text(path: &Path) -> std::io::Result<String> {
    let file = std::fs::File::open(path)?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len > TEXT_INPUT_LIMIT {
        return Err(too_large(len));
    }
    let mut text = String::new();
    // the metadata can lie (a pipe, a file growing): the bound holds on what is read
    file.take(TEXT_INPUT_LIMIT + 1).read_to_string(&mut text)?;
    if text.len() as u64 > TEXT_INPUT_LIMIT {
        return Err(too_large(text.len() as u64));
    }
    Ok(text)
}

fn too_large(len: u64) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!(
            "{:.1} MiB, more than the {} MiB a text input of kbench can be: is this the right file?",
            len as f64 / f64::from(1 << 20),
            TEXT_INPUT_LIMIT >> 20
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_files_are_refused_before_they_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big.toml");
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(TEXT_INPUT_LIMIT + 1).unwrap();
        let e = read_text(&p).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("16 MiB"), "{e}");
        std::fs::write(&p, "name = \"x\"\n").unwrap();
        assert_eq!(read_text(&p).unwrap(), "name = \"x\"\n");
    }
}
