//! eBPF instructions (the kernel's `struct bpf_insn`, `Documentation/bpf/standardization/
//! instruction-set.rst`) and a small assembler with labels.

/// One 8-byte instruction: opcode, destination and source registers, offset,
/// immediate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    pub dst: u8,
    pub src: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    /// Little-endian encoding (x86-64 is little-endian: `dst` in the low nibble).
    pub fn encode(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0] = self.code;
        b[1] = (self.dst & 0xf) | (self.src << 4);
        b[2..4].copy_from_slice(&self.off.to_le_bytes());
        b[4..8].copy_from_slice(&self.imm.to_le_bytes());
        b
    }
}

// Classes.
pub const LD: u8 = 0x00;
pub const LDX: u8 = 0x01;
pub const ST: u8 = 0x02;
pub const STX: u8 = 0x03;
pub const JMP: u8 = 0x05;
pub const ALU64: u8 = 0x07;
pub const ALU: u8 = 0x04;
// Sizes and modes.
pub const W: u8 = 0x00;
pub const H: u8 = 0x08;
pub const B: u8 = 0x10;
pub const DW: u8 = 0x18;
pub const IMM: u8 = 0x00;
pub const MEM: u8 = 0x60;
pub const ATOMIC: u8 = 0xc0;
// Sources.
pub const K: u8 = 0x00;
pub const X: u8 = 0x08;
// ALU operations.
pub const ADD: u8 = 0x00;
pub const SUB: u8 = 0x10;
pub const MUL: u8 = 0x20;
pub const DIV: u8 = 0x30;
pub const OR: u8 = 0x40;
pub const AND: u8 = 0x50;
pub const LSH: u8 = 0x60;
pub const RSH: u8 = 0x70;
pub const NEG: u8 = 0x80;
pub const MOD: u8 = 0x90;
pub const XOR: u8 = 0xa0;
pub const MOV: u8 = 0xb0;
pub const ARSH: u8 = 0xc0;
pub const END: u8 = 0xd0;
/// With [`END`]: convert to big-endian (a byte swap on this machine).
pub const TO_BE: u8 = 0x08;
// Jumps.
pub const JA: u8 = 0x00;
pub const JEQ: u8 = 0x10;
pub const JGT: u8 = 0x20;
pub const JGE: u8 = 0x30;
pub const JNE: u8 = 0x50;
pub const JSGT: u8 = 0x60;
pub const JSGE: u8 = 0x70;
pub const CALL: u8 = 0x80;
pub const EXIT: u8 = 0x90;
pub const JLT: u8 = 0xa0;
pub const JLE: u8 = 0xb0;
pub const JSLT: u8 = 0xc0;
pub const JSLE: u8 = 0xd0;

/// `src` of a 64-bit immediate load whose immediate is a map (relocated by the
/// loader).
pub const PSEUDO_MAP_FD: u8 = 1;

// Registers: r0 result, r1-r5 arguments (clobbered by calls), r6-r9 kept across
// calls, r10 the read-only frame pointer.
pub const R0: u8 = 0;
pub const R1: u8 = 1;
pub const R2: u8 = 2;
pub const R3: u8 = 3;
pub const R4: u8 = 4;
pub const R5: u8 = 5;
pub const R6: u8 = 6;
pub const R7: u8 = 7;
pub const R8: u8 = 8;
pub const R9: u8 = 9;
pub const R10: u8 = 10;

/// Kernel helper functions (`enum bpf_func_id`).
pub mod helper {
    pub const MAP_LOOKUP_ELEM: i32 = 1;
    pub const MAP_UPDATE_ELEM: i32 = 2;
    pub const MAP_DELETE_ELEM: i32 = 3;
    pub const KTIME_GET_NS: i32 = 5;
    pub const GET_PRANDOM_U32: i32 = 7;
    pub const GET_SMP_PROCESSOR_ID: i32 = 8;
    pub const GET_NUMA_NODE_ID: i32 = 42;
    pub const GET_CURRENT_PID_TGID: i32 = 14;
    pub const GET_CURRENT_UID_GID: i32 = 15;
    pub const GET_CURRENT_COMM: i32 = 16;
    pub const SEND_SIGNAL_THREAD: i32 = 117;
    pub const GET_STACK: i32 = 67;
    pub const PROBE_READ_USER: i32 = 112;
    pub const PROBE_READ_KERNEL: i32 = 113;
    pub const PROBE_READ_USER_STR: i32 = 114;
    pub const PROBE_READ_KERNEL_STR: i32 = 115;
    pub const RINGBUF_RESERVE: i32 = 131;
    pub const RINGBUF_SUBMIT: i32 = 132;
    pub const MAP_LOOKUP_PERCPU_ELEM: i32 = 195;
}

/// A jump target, bound once with [`Asm::bind`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label(usize);

/// Instructions with forward and backward jumps to labels, and the maps each 64-bit
/// immediate load refers to.
#[derive(Default)]
pub struct Asm<M> {
    pub code: Vec<Insn>,
    labels: Vec<Option<usize>>,
    fixups: Vec<(usize, Label)>,
    /// `(instruction index, map)` of each map load.
    pub maps: Vec<(usize, M)>,
}

/// Assembled instructions and the `(index, map)` of each map load.
pub type Assembled<M> = (Vec<Insn>, Vec<(usize, M)>);

/// A jump that no 16-bit offset can reach.
#[derive(Debug)]
pub struct TooFar;

impl<M> Asm<M> {
    pub fn new() -> Asm<M> {
        Asm {
            code: Vec::new(),
            labels: Vec::new(),
            fixups: Vec::new(),
            maps: Vec::new(),
        }
    }

    pub fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    pub fn bind(&mut self, l: Label) {
        self.labels[l.0] = Some(self.code.len());
    }

    fn push(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) {
        self.code.push(Insn {
            code,
            dst,
            src,
            off,
            imm,
        });
    }

    /// `dst = imm` (sign-extended 32-bit immediate) or a 64-bit immediate load.
    pub fn mov_imm(&mut self, dst: u8, v: i64) {
        if let Ok(v32) = i32::try_from(v) {
            self.push(ALU64 | MOV | K, dst, 0, 0, v32);
        } else {
            self.push(LD | DW | IMM, dst, 0, 0, v as i32);
            self.push(0, 0, 0, 0, (v >> 32) as i32);
        }
    }

    pub fn mov(&mut self, dst: u8, src: u8) {
        self.push(ALU64 | MOV | X, dst, src, 0, 0);
    }

    /// 64-bit ALU operation with a register.
    pub fn alu(&mut self, op: u8, dst: u8, src: u8) {
        self.push(ALU64 | op | X, dst, src, 0, 0);
    }

    /// 64-bit ALU operation with an immediate.
    pub fn alu_imm(&mut self, op: u8, dst: u8, imm: i32) {
        self.push(ALU64 | op | K, dst, 0, 0, imm);
    }

    /// Signed division or remainder (`op` [`DIV`] or [`MOD`]; kernel 6.6 and later).
    pub fn alu_signed(&mut self, op: u8, dst: u8, src: u8) {
        self.push(ALU64 | op | X, dst, src, 1, 0);
    }

    pub fn neg(&mut self, dst: u8) {
        self.push(ALU64 | NEG | K, dst, 0, 0, 0);
    }

    /// Byte swap of the low `bits` (16, 32, 64) bits, zero-extended.
    pub fn bswap(&mut self, dst: u8, bits: i32) {
        self.push(ALU | END | TO_BE, dst, 0, 0, bits);
    }

    /// `dst = *(size *)(src + off)`.
    pub fn load(&mut self, size: u8, dst: u8, src: u8, off: i16) {
        self.push(LDX | MEM | size, dst, src, off, 0);
    }

    /// `*(size *)(dst + off) = src`.
    pub fn store(&mut self, size: u8, dst: u8, off: i16, src: u8) {
        self.push(STX | MEM | size, dst, src, off, 0);
    }

    /// `*(size *)(dst + off) = imm`.
    pub fn store_imm(&mut self, size: u8, dst: u8, off: i16, imm: i32) {
        self.push(ST | MEM | size, dst, 0, off, imm);
    }

    /// `lock *(u64 *)(dst + off) |= src`.
    pub fn atomic_or(&mut self, dst: u8, off: i16, src: u8) {
        self.push(STX | ATOMIC | DW, dst, src, off, i32::from(OR));
    }

    pub fn call(&mut self, helper: i32) {
        self.push(JMP | CALL, 0, 0, 0, helper);
    }

    pub fn exit(&mut self) {
        self.push(JMP | EXIT, 0, 0, 0, 0);
    }

    pub fn ja(&mut self, to: Label) {
        self.fixups.push((self.code.len(), to));
        self.push(JMP | JA, 0, 0, 0, 0);
    }

    /// Jump to `to` when `dst OP src`.
    pub fn jmp(&mut self, op: u8, dst: u8, src: u8, to: Label) {
        self.fixups.push((self.code.len(), to));
        self.push(JMP | op | X, dst, src, 0, 0);
    }

    /// Jump to `to` when `dst OP imm`.
    pub fn jmp_imm(&mut self, op: u8, dst: u8, imm: i32, to: Label) {
        self.fixups.push((self.code.len(), to));
        self.push(JMP | op | K, dst, 0, 0, imm);
    }

    /// `dst = &map` (relocated by the loader).
    pub fn load_map(&mut self, dst: u8, map: M) {
        self.maps.push((self.code.len(), map));
        self.push(LD | DW | IMM, dst, PSEUDO_MAP_FD, 0, 0);
        self.push(0, 0, 0, 0, 0);
    }

    /// Resolve the jumps.
    pub fn finish(mut self) -> Result<Assembled<M>, TooFar> {
        for &(at, l) in &self.fixups {
            let to = self.labels[l.0].expect("every label is bound");
            let off = to as i64 - at as i64 - 1;
            self.code[at].off = i16::try_from(off).map_err(|_| TooFar)?;
        }
        Ok((self.code, self.maps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_as_the_kernel_lays_out_bpf_insn() {
        // r1 = *(u64 *)(r10 - 8)
        let mut a: Asm<()> = Asm::new();
        a.load(DW, R1, R10, -8);
        a.mov_imm(R2, 0x1_0000_0002);
        let l = a.label();
        a.jmp_imm(JEQ, R1, 0, l);
        a.exit();
        a.bind(l);
        a.exit();
        let (code, _) = a.finish().unwrap();
        assert_eq!(code[0].encode(), [0x79, 0xa1, 0xf8, 0xff, 0, 0, 0, 0]);
        assert_eq!(code[1].encode(), [0x18, 0x02, 0, 0, 2, 0, 0, 0]);
        assert_eq!(code[2].encode(), [0, 0, 0, 0, 1, 0, 0, 0]);
        // The jump skips one instruction.
        assert_eq!(code[3].encode(), [0x15, 0x01, 1, 0, 0, 0, 0, 0]);
    }
}
