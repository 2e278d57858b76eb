// A Rust program for crates/cli/tests/names.rs: rsapp::worker::step is called
// six times.
mod worker {
    #[inline(never)]
    pub fn step(x: u64) -> u64 {
        std::hint::black_box(x) * 2
    }
}

fn main() {
    let mut s = 0;
    for i in 0..6 {
        s += worker::step(std::hint::black_box(i));
    }
    println!("{s}");
}
