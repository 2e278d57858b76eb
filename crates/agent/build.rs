//! The agent is linked `-z initfirst` (DF_1_INITFIRST): the dynamic loader runs its
//! constructor before every other object's, before even the program's
//! `.preinit_array` and the C library's own initializers. So a launched program's
//! probes are in before any constructor of the program or its libraries runs.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,initfirst");
}
