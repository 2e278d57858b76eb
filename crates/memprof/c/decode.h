/* The memory operand of one x86-64 instruction, for sampled mode (sample.h): its
 * effective address from the interrupted registers, and whether the instruction
 * reads it, writes it or both. Enough of the encoding for that: legacy prefixes,
 * REX, VEX (2- and 3-byte), the one-byte, 0F, 0F38 and 0F3A maps, ModRM/SIB/
 * displacement, and the string instructions' implicit [rsi]/[rdi]. What it does
 * not decode gives no access (the sample is not attributed): EVEX, 16/32-bit
 * addressing (0x67), FS/GS-relative (TLS), RIP-relative (globals, code), vector
 * gathers/scatters, stack pushes and pops, and instructions that name memory
 * without accessing it (lea, nop, prefetch, clflush). It reads a copy of the
 * code (sample.h), never the program's memory. */
#define ACC_READ 1
#define ACC_WRITE 2
#define ACC_RMW 3
struct access {
  uintptr_t addr;
  int kind;
  unsigned bytes;
};

/* x86 register number -> the ucontext's gregs index. */
static const int greg_of[16] = {REG_RAX, REG_RCX, REG_RDX, REG_RBX, REG_RSP, REG_RBP, REG_RSI, REG_RDI,
                                REG_R8,  REG_R9,  REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15};

/* The access kind of a one-byte-map opcode with a ModRM memory operand (0: none
 * or not an access). */
static int kind_map0(uint8_t op, int reg) {
  if (op < 0x40 && (op & 7) < 4) {
    if ((op & 7) >= 2 || (op >> 3) == 7) return ACC_READ; /* op r, r/m; cmp */
    return ACC_RMW;                                        /* op r/m, r */
  }
  switch (op) {
  case 0x63: case 0x69: case 0x6b: case 0x84: case 0x85: case 0x8a: case 0x8b: case 0x8e:
    return ACC_READ;
  case 0x80: case 0x81: case 0x83:
    return reg == 7 ? ACC_READ : ACC_RMW;
  case 0x86: case 0x87: case 0xc0: case 0xc1: case 0xd0: case 0xd1: case 0xd2: case 0xd3:
    return ACC_RMW;
  case 0x88: case 0x89: case 0x8c: case 0x8f: case 0xc6: case 0xc7:
    return ACC_WRITE;
  case 0xf6: case 0xf7:
    return reg == 2 || reg == 3 ? ACC_RMW : ACC_READ;
  case 0xfe: case 0xff:
    return reg <= 1 ? ACC_RMW : reg <= 6 ? ACC_READ : 0;
  default:
    if (op >= 0xd8 && op <= 0xdf) return ACC_READ; /* x87 */
    return 0;
  }
}

/* One-byte map: whether the opcode has a ModRM byte. */
static int modrm_map0(uint8_t op) {
  if (op < 0x40) return (op & 7) < 4;
  switch (op) {
  case 0x63: case 0x69: case 0x6b: case 0xc0: case 0xc1: case 0xc6: case 0xc7: case 0xf6:
  case 0xf7: case 0xfe: case 0xff:
    return 1;
  default:
    return (op >= 0x80 && op <= 0x8e) || (op >= 0xd0 && op <= 0xd3) || (op >= 0xd8 && op <= 0xdf);
  }
}

/* 0F map: whether the opcode has a ModRM byte. */
static int modrm_map1(uint8_t op) {
  switch (op) {
  case 0x04: case 0x05: case 0x06: case 0x07: case 0x08: case 0x09: case 0x0a: case 0x0b:
  case 0x0c: case 0x0e: case 0x77: case 0xa0: case 0xa1: case 0xa2: case 0xa8: case 0xa9:
  case 0xaa:
    return 0;
  default:
    return !(op >= 0x30 && op <= 0x37) && !(op >= 0x80 && op <= 0x8f) && !(op >= 0xc8 && op <= 0xcf);
  }
}

/* 0F map: the access kind (pp: 0 none, 1 66, 2 F3, 3 F2). */
static int kind_map1(uint8_t op, int reg, int pp) {
  switch (op) {
  case 0x00: case 0x01: case 0x0d: case 0xae: /* system, prefetchw, fxsave & clflush */
    return 0;
  case 0x11: case 0x13: case 0x17: case 0x29: case 0x2b: case 0x7f: case 0xc3: case 0xd6: case 0xe7:
    return ACC_WRITE;
  case 0x7e:
    return pp == 2 ? ACC_READ : ACC_WRITE; /* movq xmm, m64 : movd/movq m, xmm */
  case 0xa3:
    return ACC_READ;
  case 0xa4: case 0xa5: case 0xab: case 0xac: case 0xad: case 0xb0: case 0xb1: case 0xb3:
  case 0xbb: case 0xc0: case 0xc1:
    return ACC_RMW;
  case 0xba:
    return reg == 4 ? ACC_READ : ACC_RMW;
  case 0xc7:
    return reg == 1 ? ACC_RMW : 0; /* cmpxchg8b/16b; rdrand and the like are registers */
  default:
    if (op >= 0x18 && op <= 0x1f) return 0; /* prefetch hints, nop, endbr */
    if (op >= 0x90 && op <= 0x9f) return ACC_WRITE; /* setcc */
    return ACC_READ;
  }
}

static int kind_map2(uint8_t op, int vex, int pp) {
  if (op >= 0x90 && op <= 0x93) return 0;       /* gathers: VSIB */
  if (op >= 0xa0 && op <= 0xa3) return 0;       /* scatters */
  if (op == 0xf1 && pp != 3) return ACC_WRITE;  /* movbe m, r */
  if (vex && (op == 0x2e || op == 0x2f || op == 0x8e)) return ACC_WRITE; /* masked stores */
  return ACC_READ;
}

static int kind_map3(uint8_t op) {
  switch (op) {
  case 0x14: case 0x15: case 0x16: case 0x17: case 0x19: case 0x1d: case 0x39: case 0x7d:
    return ACC_WRITE; /* pextr*, extractps, vextract*, vcvtps2ph */
  default:
    return ACC_READ;
  }
}

static inline int32_t le32(const uint8_t *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

/* The immediate's size after the ModRM operand of a memory-operand instruction. */
static int imm_size(int map, uint8_t op, int reg, int opsize) {
  int z = opsize ? 2 : 4;
  if (map == 0) {
    switch (op) {
    case 0x69: case 0x81: case 0xc7: return z;
    case 0x6b: case 0x80: case 0x83: case 0xc0: case 0xc1: case 0xc6: return 1;
    case 0xf6: return reg < 2 ? 1 : 0;
    case 0xf7: return reg < 2 ? z : 0;
    default: return 0;
    }
  }
  if (map == 3) return 1;
  if (map == 1)
    return (op >= 0x70 && op <= 0x73) || op == 0xa4 || op == 0xac || op == 0xba || op == 0xc2 ||
           op == 0xc4 || op == 0xc5 || op == 0xc6;
  return 0;
}

/* Whether a memory-operand instruction writes the general register its ModRM
 * reg field names (a load into it, an exchange): then, decoded after it ran,
 * its address is unknown if that register is its base or index. */
static int writes_reg(int map, uint8_t op, int vex) {
  if (vex) return 0;
  if (map == 0)
    return (op < 0x40 && (op & 7) >= 2 && (op >> 3) != 7) || op == 0x63 || op == 0x69 || op == 0x6b ||
           op == 0x86 || op == 0x87 || op == 0x8a || op == 0x8b;
  if (map == 1)
    return (op >= 0x40 && op <= 0x4f) || op == 0xaf || op == 0xb6 || op == 0xb7 || op == 0xbe ||
           op == 0xbf || op == 0xbc || op == 0xbd || op == 0xb8 || op == 0xc0 || op == 0xc1;
  return 0;
}

/* Fills out[] (at most 2) with the memory accesses of the instruction at p;
 * returns how many, and its length in *len (when it has accesses). `after`:
 * the registers are those after the instruction ran; -1 when the access's address
 * cannot be computed from them (a load into its own base or index register). */
static int decode_access(const uint8_t *p, const greg_t *g, struct access *out, int *len, int after) {
  int i = 0, rex = 0, opsize = 0, rep = 0, map = 0, pp = 0, vex = 0;
  for (;; i++) {
    if (i >= 14) return 0;
    uint8_t b = p[i];
    if (b == 0x66) opsize = 1;
    else if (b == 0xf3) rep = 2;
    else if (b == 0xf2) rep = 3;
    else if (b == 0xf0 || b == 0x2e || b == 0x36 || b == 0x3e || b == 0x26) {
    } else if (b == 0x67 || b == 0x64 || b == 0x65) return 0;
    else break;
  }
  if ((p[i] & 0xf0) == 0x40) rex = p[i++];
  uint8_t b = p[i];
  uint8_t op;
  if (b == 0xc5) {
    uint8_t b1 = p[i + 1];
    rex = (b1 & 0x80) ? 0 : 0x44;
    map = 1;
    pp = b1 & 3;
    op = p[i + 2];
    i += 3;
    vex = 1;
  } else if (b == 0xc4) {
    uint8_t b1 = p[i + 1], b2 = p[i + 2];
    rex = 0x40 | ((b1 & 0x80) ? 0 : 4) | ((b1 & 0x40) ? 0 : 2) | ((b1 & 0x20) ? 0 : 1) | ((b2 & 0x80) ? 8 : 0);
    map = b1 & 0x1f;
    if (map < 1 || map > 3) return 0;
    pp = b2 & 3;
    op = p[i + 3];
    i += 4;
    vex = 1;
  } else if (b == 0x62 || b == 0x8f) {
    return 0; /* EVEX; XOP or pop r/m (a stack-ish write we do not need) */
  } else if (b == 0x0f) {
    uint8_t b1 = p[i + 1];
    if (b1 == 0x38 || b1 == 0x3a) {
      map = b1 == 0x38 ? 2 : 3;
      op = p[i + 2];
      i += 3;
    } else {
      map = 1;
      op = b1;
      i += 2;
    }
    pp = opsize ? 1 : rep;
  } else {
    op = b;
    i++;
    /* String instructions: [rsi] and/or [rdi], no ModRM. */
    if ((op >= 0xa4 && op <= 0xa7) || (op >= 0xaa && op <= 0xaf)) {
      unsigned sz = (op & 1) ? ((rex & 8) ? 8 : opsize ? 2 : 4) : 1;
      uintptr_t si = (uintptr_t)g[REG_RSI], di = (uintptr_t)g[REG_RDI];
      int n = 0;
      switch (op & 0xfe) {
      case 0xa4: /* movs */
        out[n++] = (struct access){si, ACC_READ, sz};
        out[n++] = (struct access){di, ACC_WRITE, sz};
        break;
      case 0xa6: /* cmps */
        out[n++] = (struct access){si, ACC_READ, sz};
        out[n++] = (struct access){di, ACC_READ, sz};
        break;
      case 0xaa: out[n++] = (struct access){di, ACC_WRITE, sz}; break; /* stos */
      case 0xac: out[n++] = (struct access){si, ACC_READ, sz}; break;  /* lods */
      case 0xae: out[n++] = (struct access){di, ACC_READ, sz}; break;  /* scas */
      }
      *len = i;
      return n;
    }
  }
  /* The ModRM byte (read only when the opcode has one) and the kind. */
  if ((map == 0 && !modrm_map0(op)) || (map == 1 && !modrm_map1(op))) return 0;
  uint8_t modrm = p[i++];
  int mod = modrm >> 6, reg = (modrm >> 3) & 7, rm = modrm & 7;
  if (mod == 3) return 0;
  int kind;
  if (map == 0) {
    if (op == 0x8d) return 0; /* lea */
    kind = kind_map0(op, reg);
  } else if (map == 1) {
    kind = kind_map1(op, reg, pp);
  } else if (map == 2) {
    kind = kind_map2(op, vex, pp);
  } else {
    kind = kind_map3(op);
  }
  if (!kind) return 0;
  int dest = after && writes_reg(map, op, vex) ? reg | ((rex & 4) ? 8 : 0) : -1;
  uintptr_t addr;
  if (rm == 4) {
    uint8_t sib = p[i++];
    int scale = sib >> 6, idx = ((sib >> 3) & 7) | ((rex & 2) ? 8 : 0), base = sib & 7;
    int lost = idx == dest;
    addr = idx == 4 ? 0 : (uintptr_t)g[greg_of[idx]] << scale;
    if (base == 5 && mod == 0) {
      addr += (uintptr_t)(intptr_t)le32(p + i);
      i += 4;
    } else {
      base |= (rex & 1) ? 8 : 0;
      lost |= base == dest;
      addr += (uintptr_t)g[greg_of[base]];
    }
    if (lost) addr = 0;
  } else if (rm == 5 && mod == 0) {
    return 0; /* RIP-relative */
  } else {
    int base = rm | ((rex & 1) ? 8 : 0);
    addr = base == dest ? 0 : (uintptr_t)g[greg_of[base]];
  }
  int gone = dest >= 0 && !addr;
  if (mod == 1) addr += (uintptr_t)(intptr_t)(int8_t)p[i++];
  else if (mod == 2) {
    addr += (uintptr_t)(intptr_t)le32(p + i);
    i += 4;
  }
  *len = i + imm_size(map, op, reg, opsize);
  if (gone) return -1;
  unsigned bytes = (rex & 8) ? 8 : opsize ? 2 : (map == 0 && !(op & 1) && op < 0xc8) ? 1 : map ? 16 : 4;
  out[0] = (struct access){addr, kind, bytes};
  return 1;
}

static int is_prefix(uint8_t b) {
  return (b & 0xf0) == 0x40 || b == 0x66 || b == 0xf2 || b == 0xf3 || b == 0xf0 || b == 0x2e ||
         b == 0x3e || b == 0x26 || b == 0x36;
}

/* The accesses a sample at pc stands for. The interrupt is taken after the
 * instruction that held the thread (a load that missed the cache retires, the
 * next one is interrupted), so it is the instruction before pc that is tried
 * first, with the registers as it left them: the shortest L such that an access
 * instruction of exactly L bytes ends at pc, widened over the prefix bytes before
 * it. When that one gives nothing (no access, or a load into its own base or
 * index register, `mov (%rdx),%rdx`, whose address is gone), the instruction at
 * pc, about to run, with its registers intact. A string instruction at pc with a
 * rep prefix is interrupted inside itself: it is decoded first. x86 code cannot
 * be decoded backwards for sure: a wrong L is possible, rare (the length must
 * come out exact), and costs one misattributed sample. pc points into a copy of
 * the code with 16 bytes before it and 32 after. */
static int decode_sample(const uint8_t *pc, const greg_t *g, struct access *out) {
  int len;
  if (pc[0] == 0xf3 || pc[0] == 0xf2) {
    int n = decode_access(pc, g, out, &len, 0);
    if (n && (out[0].addr == (uintptr_t)g[REG_RSI] || out[0].addr == (uintptr_t)g[REG_RDI])) return n;
  }
  for (int l = 1; l <= 15; l++) {
    int n = decode_access(pc - l, g, out, &len, 1);
    if (!n || len != l) continue;
    if (n < 0) break;
    while (l < 15 && is_prefix(pc[-l - 1])) {
      struct access wider[2];
      int m = decode_access(pc - l - 1, g, wider, &len, 1);
      if (m <= 0 || len != l + 1) break;
      l++;
      n = m;
      out[0] = wider[0];
      out[1] = wider[1];
    }
    return n;
  }
  int n = decode_access(pc, g, out, &len, 0);
  return n > 0 ? n : 0;
}
