//! `weft`: see `weft --help` and the README.

fn main() {
    let code = match weft::main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("weft: {e:#}");
            1
        }
    };
    std::process::exit(code);
}
