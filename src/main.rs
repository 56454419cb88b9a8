fn main() {
    std::process::exit(kbench::cli::main());
}
