//! DWARF parameters and lines of programs built with `gcc -g`.

mod common;

use common::cc;
use weft_ir::{CField, CStruct, Type};
use weft_symbols::{ElfFile, Param};

const SRC: &str = r#"struct inner { char c; long l; };
struct point { int x; int y; struct inner in; int arr[3]; struct point *next; unsigned char flag; };
enum color { RED, GREEN };
typedef struct { int a; int b:3; int c; } pair_t;
union number { int i; long l; };

int f(struct point *p, long n) {
    return p->x + (int)n;
}

int g(pair_t *q, const char *s, double d, enum color c, union number *u, void *opaque, int (*cb)(int)) {
    return q->a + s[0] + (int)d + (int)c + u->i + (opaque != 0) + cb(1);
}

static int one(int x) { return x; }

struct grid { short cells[2][3]; unsigned char big[100]; char name[8]; char names[2][4]; };
int h(struct grid *gr) { return gr->cells[1][2]; }

int main(void) {
    struct point pt = {0};
    pair_t pr = {0};
    union number num = {0};
    struct grid gr = {0};
    return f(&pt, 1) + g(&pr, "x", 1.0, RED, &num, 0, one) + h(&gr);
}
"#;

fn int(bits: u8, signed: bool) -> Type {
    Type::Int { bits, signed }
}

fn field(name: &str, offset: u32, ty: Type) -> CField {
    CField {
        name: name.into(),
        offset,
        ty,
        bits: None,
    }
}

fn cstruct(name: &str, size: u32, fields: Vec<CField>) -> Type {
    Type::CStruct(CStruct {
        name: name.into(),
        size,
        fields: fields.into(),
    })
}

#[test]
fn struct_pointer_parameters() {
    let dir = tempfile::tempdir().unwrap();
    for opt in ["-O0", "-O2"] {
        let exe = cc(dir.path(), "app", &[("t.c", SRC)], &["-g", opt]);
        let elf = ElfFile::open(&exe).unwrap();
        assert!(elf.has_debug_info());
        let dbg = elf.debug_info().unwrap().unwrap();

        let inner = cstruct(
            "inner",
            16,
            vec![field("c", 0, int(8, true)), field("l", 8, int(64, true))],
        );
        let arr = cstruct(
            "int32[3]",
            12,
            vec![
                field("[0]", 0, int(32, true)),
                field("[1]", 4, int(32, true)),
                field("[2]", 8, int(32, true)),
            ],
        );
        let point = cstruct(
            "point",
            56,
            vec![
                field("x", 0, int(32, true)),
                field("y", 4, int(32, true)),
                field("in", 8, inner),
                field("arr", 24, arr),
                // The struct being expanded is opaque when reached again.
                field(
                    "next",
                    40,
                    Type::Ptr(Box::new(cstruct("point", 56, vec![]))),
                ),
                field("flag", 48, int(8, false)),
            ],
        );
        assert_eq!(
            dbg.function_params("f").unwrap(),
            vec![
                Param {
                    name: "p".into(),
                    ty: Type::Ptr(Box::new(point)),
                    c_type: "struct point*".into(),
                },
                Param {
                    name: "n".into(),
                    ty: int(64, true),
                    c_type: "long int".into(),
                },
            ],
            "{opt}"
        );

        let params = dbg.function_params("g").unwrap();
        let names: Vec<&str> = params.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["q", "s", "d", "c", "u", "opaque", "cb"]);
        // Bitfields are left out; the typedef names the anonymous struct.
        assert_eq!(
            params[0].ty,
            Type::Ptr(Box::new(cstruct(
                "pair_t",
                12,
                vec![field("a", 0, int(32, true)), field("c", 8, int(32, true))]
            )))
        );
        assert_eq!(params[1].ty, Type::Ptr(Box::new(int(8, true))));
        assert_eq!(params[2].ty, int(64, false), "doubles are raw bits");
        assert_eq!(params[3].ty, int(32, false), "enum color is unsigned int");
        assert_eq!(
            params[4].ty,
            Type::Ptr(Box::new(cstruct(
                "number",
                8,
                vec![field("i", 0, int(32, true)), field("l", 0, int(64, true))]
            )))
        );
        assert_eq!(params[5].ty, Type::Ptr(Box::new(Type::Void)));
        assert_eq!(params[6].ty, Type::Ptr(Box::new(Type::Void)));

        // Arrays: small ones element by element (outer dimension first), big ones
        // by size only.
        let row = cstruct(
            "int16[3]",
            6,
            vec![
                field("[0]", 0, int(16, true)),
                field("[1]", 2, int(16, true)),
                field("[2]", 4, int(16, true)),
            ],
        );
        let cells = cstruct(
            "int16[2][3]",
            12,
            vec![field("[0]", 0, row.clone()), field("[1]", 6, row)],
        );
        let big = cstruct("uint8[100]", 100, vec![]);
        // Plain `char` arrays are strings of their length (the last dimension).
        let names = cstruct(
            "string[2][4]",
            8,
            vec![
                field("[0]", 0, Type::Str { cap: 4 }),
                field("[1]", 4, Type::Str { cap: 4 }),
            ],
        );
        assert_eq!(
            dbg.function_params("h").unwrap(),
            vec![Param {
                name: "gr".into(),
                ty: Type::Ptr(Box::new(cstruct(
                    "grid",
                    128,
                    vec![
                        field("cells", 0, cells),
                        field("big", 12, big),
                        field("name", 112, Type::Str { cap: 8 }),
                        field("names", 120, names),
                    ]
                ))),
                c_type: "struct grid*".into(),
            }]
        );

        // As C (and `bpftrace -lv`) spells them.
        let c: Vec<String> = dbg
            .function_params("g")
            .unwrap()
            .into_iter()
            .map(|p| p.c_type)
            .collect();
        assert_eq!(
            c,
            [
                "pair_t*",
                "const char*",
                "double",
                "enum color",
                "union number*",
                "void*",
                "int (*)(...)"
            ],
            "{opt}"
        );

        assert_eq!(dbg.function_params("main").unwrap(), vec![]);
        assert_eq!(dbg.function_params("nope"), None);

        // Lines: f opens on line 7 of t.c; at -O2 its first instruction is line 8's.
        let fv = elf
            .functions()
            .iter()
            .find(|x| x.name() == "f")
            .unwrap()
            .vaddr;
        let (file, line) = dbg.line_for(fv).unwrap();
        assert!(file.ends_with("t.c"), "{file}");
        assert_eq!(line, if opt == "-O0" { 7 } else { 8 }, "{opt}");
        assert_eq!(dbg.line_for(0), None);
    }
}

#[test]
fn no_debug_info() {
    let dir = tempfile::tempdir().unwrap();
    let exe = cc(dir.path(), "app", &[("t.c", SRC)], &["-g0"]);
    let elf = ElfFile::open(&exe).unwrap();
    assert!(!elf.has_debug_info());
    assert!(elf.debug_info().unwrap().is_none());
}
