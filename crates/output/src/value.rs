//! Decoding bytes laid out by [`Type`] into [`Value`]s.

use weft_ir::{FmtId, StackMode, Type};

/// A decoded value. Integers are already sign- or zero-extended from their width.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// A value of type `Void`.
    None,
    /// A signed integer of any width.
    Int(i64),
    /// An unsigned integer of any width.
    UInt(u64),
    Bool(bool),
    /// String bytes, up to (not including) the first NUL.
    Str(Vec<u8>),
    /// A `buf()`: `len` valid bytes (at most the capacity) and the whole capacity, which
    /// bpftrace 0.17 prints when a buffer is a map key.
    Buf {
        len: u32,
        data: Vec<u8>,
    },
    Tuple(Vec<Value>),
    /// A record (named tuple).
    Record(Vec<(String, Value)>),
    /// A code address, printed as its symbol.
    USym(u64),
    /// A user stack: the return addresses, innermost first, up to the first zero.
    UStack {
        mode: StackMode,
        ips: Vec<u64>,
    },
    /// The index of a probe name.
    Probe(u64),
    /// A `strftime(fmt, nsecs)` value: `nsecs` is CLOCK_REALTIME.
    Timestamp {
        fmt: FmtId,
        nsecs: u64,
    },
    Ptr(u64),
    /// A value of an enum: the number, and its enumerator's name if it has one.
    Enum {
        value: i64,
        name: Option<String>,
    },
    /// A C struct or union.
    Struct {
        name: String,
        fields: Vec<(String, Value)>,
    },
    /// A C array: a [`Type::CStruct`] whose name ends with `]` (`int[4]`), its fields
    /// being the elements in order.
    Array(Vec<Value>),
    /// An `ntop()` address: the family and the 16 address bytes (IPv4 in the first 4).
    Inet {
        af: u64,
        addr: [u8; 16],
    },
    /// A `macaddr()` value.
    MacAddr([u8; 6]),
}

/// True when a C aggregate type is an array (by the naming convention of
/// [`Value::Array`]).
pub(crate) fn is_c_array(name: &str) -> bool {
    name.ends_with(']')
}

/// Decode `bytes` as a value of type `ty`. Missing bytes read as zero, so a short
/// buffer never panics.
pub fn decode(ty: &Type, bytes: &[u8]) -> Value {
    match ty {
        Type::Void => Value::None,
        Type::Int { bits, signed } => {
            let n = usize::from(*bits / 8);
            let raw = read_uint(bytes, 0, n);
            if *signed {
                Value::Int(sign_extend(raw, *bits))
            } else {
                Value::UInt(raw)
            }
        }
        Type::Bool => Value::Bool(byte(bytes, 0) != 0),
        Type::Str { cap } => Value::Str(c_string(bytes, 0, *cap as usize)),
        Type::Buf { cap } => {
            let len = read_uint(bytes, 0, 4) as u32;
            let data = (0..*cap as usize).map(|i| byte(bytes, 4 + i)).collect();
            Value::Buf {
                len: len.min(*cap),
                data,
            }
        }
        Type::Tuple(fields) => {
            let offs = ty.field_offsets();
            Value::Tuple(
                fields
                    .iter()
                    .zip(offs)
                    .map(|(t, o)| decode(t, tail(bytes, o)))
                    .collect(),
            )
        }
        Type::Record(fields) => {
            let offs = ty.field_offsets();
            Value::Record(
                fields
                    .iter()
                    .zip(offs)
                    .map(|((n, t), o)| (n.clone(), decode(t, tail(bytes, o))))
                    .collect(),
            )
        }
        Type::USym => Value::USym(read_uint(bytes, 0, 8)),
        Type::UStack { depth, mode } => {
            let n = read_uint(bytes, 0, 8).min(u64::from(*depth)) as usize;
            let ips = (0..n)
                .map(|i| read_uint(bytes, 8 + 8 * i, 8))
                .take_while(|&ip| ip != 0)
                .collect();
            Value::UStack { mode: *mode, ips }
        }
        Type::ProbeName => Value::Probe(read_uint(bytes, 0, 8)),
        Type::Timestamp => Value::Timestamp {
            fmt: FmtId(read_uint(bytes, 0, 8) as u32),
            nsecs: read_uint(bytes, 8, 8),
        },
        Type::Ptr(_) => Value::Ptr(read_uint(bytes, 0, 8)),
        Type::Inet => Value::Inet {
            af: read_uint(bytes, 0, 8),
            addr: std::array::from_fn(|i| byte(bytes, 8 + i)),
        },
        Type::MacAddr => Value::MacAddr(std::array::from_fn(|i| byte(bytes, i))),
        Type::Enum(e) => {
            let value = read_uint(bytes, 0, 8) as i64;
            Value::Enum {
                value,
                name: e.name_of(value).map(str::to_string),
            }
        }
        Type::CStruct(s) => {
            let fields = s.fields.iter().map(|f| {
                let at = tail(bytes, f.offset);
                let v = match f.bits {
                    // A bit-field: its bits of the storage unit (zero-extended,
                    // as bpftrace reads them).
                    Some(b) => {
                        let unit = read_uint(at, 0, f.ty.size() as usize);
                        let v = b.extract(unit);
                        decode(&f.ty, &v.to_le_bytes())
                    }
                    None => decode(&f.ty, at),
                };
                (f.name.clone(), v)
            });
            if is_c_array(&s.name) {
                Value::Array(fields.map(|(_, v)| v).collect())
            } else {
                Value::Struct {
                    name: s.name.clone(),
                    fields: fields.collect(),
                }
            }
        }
    }
}

pub(crate) fn byte(bytes: &[u8], i: usize) -> u8 {
    bytes.get(i).copied().unwrap_or(0)
}

fn tail(bytes: &[u8], off: u32) -> &[u8] {
    bytes.get(off as usize..).unwrap_or(&[])
}

/// Little-endian unsigned integer of `n` bytes at `off` (missing bytes are zero).
pub(crate) fn read_uint(bytes: &[u8], off: usize, n: usize) -> u64 {
    (0..n.min(8)).fold(0u64, |acc, i| {
        acc | u64::from(byte(bytes, off + i)) << (8 * i)
    })
}

pub(crate) fn read_u64(bytes: &[u8], index: usize) -> u64 {
    read_uint(bytes, 8 * index, 8)
}

pub(crate) fn sign_extend(raw: u64, bits: u8) -> i64 {
    if bits >= 64 || bits == 0 {
        raw as i64
    } else {
        let shift = 64 - u32::from(bits);
        ((raw << shift) as i64) >> shift
    }
}

/// The bytes of a NUL-padded string field of `cap` bytes, up to the first NUL.
fn c_string(bytes: &[u8], off: usize, cap: usize) -> Vec<u8> {
    (0..cap)
        .map(|i| byte(bytes, off + i))
        .take_while(|&b| b != 0)
        .collect()
}

impl Value {
    /// The value as a 64-bit register would hold it (integers, bools, addresses).
    pub fn as_u64(&self) -> u64 {
        match self {
            Value::Int(v) | Value::Enum { value: v, .. } => *v as u64,
            Value::UInt(v) | Value::USym(v) | Value::Probe(v) | Value::Ptr(v) => *v,
            Value::Bool(b) => u64::from(*b),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_ir::{CField, CStruct};

    #[test]
    fn ints_extend_by_signedness() {
        assert_eq!(
            decode(
                &Type::Int {
                    bits: 8,
                    signed: true
                },
                &[0xfe]
            ),
            Value::Int(-2)
        );
        assert_eq!(
            decode(
                &Type::Int {
                    bits: 8,
                    signed: false
                },
                &[0xfe]
            ),
            Value::UInt(254)
        );
        assert_eq!(
            decode(
                &Type::Int {
                    bits: 32,
                    signed: true
                },
                &[0xff; 4]
            ),
            Value::Int(-1)
        );
        assert_eq!(
            decode(&Type::U64, &[1]),
            Value::UInt(1),
            "short input reads as zeros"
        );
    }

    #[test]
    fn tuple_uses_ir_layout() {
        let ty = Type::Tuple(vec![
            Type::Int {
                bits: 8,
                signed: false,
            },
            Type::I64,
            Type::Str { cap: 4 },
        ]);
        let mut bytes = vec![0u8; ty.size() as usize];
        bytes[0] = 7;
        bytes[8..16].copy_from_slice(&(-3i64).to_le_bytes());
        bytes[16..18].copy_from_slice(b"ab");
        assert_eq!(
            decode(&ty, &bytes),
            Value::Tuple(vec![
                Value::UInt(7),
                Value::Int(-3),
                Value::Str(b"ab".to_vec())
            ])
        );
    }

    #[test]
    fn buffer_and_stack() {
        let b = decode(&Type::Buf { cap: 4 }, &[9, 0, 0, 0, 1, 2, 3, 4]);
        assert_eq!(
            b,
            Value::Buf {
                len: 4,
                data: vec![1, 2, 3, 4]
            },
            "len is clamped to the capacity"
        );
        let mut s = vec![0u8; 8 + 8 * 3];
        s[0] = 3;
        s[8] = 0x10;
        s[16] = 0x20;
        let st = decode(
            &Type::UStack {
                depth: 3,
                mode: StackMode::Bpftrace,
            },
            &s,
        );
        assert_eq!(
            st,
            Value::UStack {
                mode: StackMode::Bpftrace,
                ips: vec![0x10, 0x20]
            }
        );
    }

    #[test]
    fn c_arrays_by_name() {
        let int = Type::Int {
            bits: 32,
            signed: true,
        };
        let arr = Type::CStruct(CStruct {
            name: "int[2]".into(),
            size: 8,
            fields: [
                CField {
                    name: "0".into(),
                    offset: 0,
                    ty: int.clone(),
                    bits: None,
                },
                CField {
                    name: "1".into(),
                    offset: 4,
                    ty: int,
                    bits: None,
                },
            ]
            .into(),
        });
        assert_eq!(
            decode(&arr, &[1, 0, 0, 0, 2, 0, 0, 0]),
            Value::Array(vec![Value::Int(1), Value::Int(2)])
        );
    }
}
