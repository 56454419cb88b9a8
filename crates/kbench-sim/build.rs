//! Compiles the embedded op tables (src/optable/compiled.rs) with the runtime's parser.

// the build script encodes, the library decodes: each leaves the other's half unused
#[allow(dead_code)]
#[path = "src/optable/compiled.rs"]
mod compiled;
#[path = "src/optable/csv.rs"]
mod csv;

use std::path::Path;

fn main() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/optables");
    let out = std::env::var_os("OUT_DIR").map(std::path::PathBuf::from);
    let out = out.expect("cargo sets OUT_DIR for build scripts");
    println!("cargo:rerun-if-changed=src/optable/compiled.rs");
    println!("cargo:rerun-if-changed=src/optable/csv.rs");
    for system in compiled::EMBEDDED_SYSTEMS {
        let mut rows = Vec::new();
        for file in compiled::TABLE_FILES {
            let path = data.join(system).join(file);
            println!("cargo:rerun-if-changed={}", path.display());
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            if let Err(e) = csv::parse_csv(&text, &mut rows) {
                panic!("{}:{}: {}", path.display(), e.line, e.message);
            }
        }
        csv::normalise(&mut rows);
        let target = out.join(format!("{system}.optable"));
        std::fs::write(&target, compiled::encode(&rows))
            .unwrap_or_else(|e| panic!("writing {}: {e}", target.display()));
    }
}
