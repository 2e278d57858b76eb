//! Helpers shared by the integration tests.
#![allow(dead_code)]

use weft_x86::{disassemble, FunctionCode};

/// A function of known size.
pub fn func(addr: u64, bytes: &[u8]) -> FunctionCode {
    FunctionCode {
        addr,
        bytes: bytes.to_vec(),
        size_known: true,
        padding: Vec::new(),
    }
}

/// The instructions of `bytes` at `addr` in Intel syntax, joined by "; " (the text
/// column of [`disassemble`]).
pub fn asm(bytes: &[u8], addr: u64) -> String {
    disassemble(bytes, addr)
        .lines()
        .map(|line| {
            line.splitn(3, "  ")
                .nth(2)
                .expect("address, bytes, text")
                .trim_start()
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("; ")
}
