//! See Cargo.toml description and ARCHITECTURE.md.
