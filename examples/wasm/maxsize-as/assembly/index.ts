// maxsize-as: a Ferry WebAssembly interceptor (ABI v1, docs/INTERCEPTORS.md)
// written in AssemblyScript against the ABI directly. At produce, a record
// whose key, value and headers (names and values) together are larger
// than max.bytes (wasm.config.max.bytes) is rejected with a reason the
// producer sees; a batch without such a record is kept whole (output of
// length 0). No host imports: the buffers are managed here, in linear
// memory, and reused from call to call.

// The configured bound, in bytes.
let maxBytes: u64 = 0;

// The input buffer (ferry_alloc) and the output buffer, grown on demand.
let inBuf: usize = 0;
let inCap: usize = 0;
let outBuf: usize = 0;
let outCap: usize = 0;
let outLen: usize = 0;

// abort replaces AssemblyScript's default (an import from "env", which
// the host does not offer): a trap, which fails the call.
function abort(message: string | null, fileName: string | null, line: u32, column: u32): void {
  unreachable();
}

// reserve returns a pointer to n fresh bytes. The stub runtime's heap
// frees nothing, so buffers only grow (geometrically: what is held stays
// within twice the largest batch) and are reused from call to call.
function reserve(n: usize): usize {
  return heap.alloc(n);
}

export function ferry_abi_v1(): void {}

export function ferry_alloc(size: i32): i32 {
  if (size < 0) return 0;
  if (<usize>size > inCap) {
    inCap = (<usize>size + 0xffff) & ~0xffff;
    inBuf = reserve(inCap);
  }
  return <i32>inBuf;
}

function outReserve(n: usize): void {
  if (outLen + n <= outCap) return;
  let cap = outCap * 2;
  if (cap < outLen + n) cap = outLen + n;
  cap = (cap + 0xffff) & ~0xffff;
  const next = reserve(cap);
  memory.copy(next, outBuf, outLen);
  outBuf = next;
  outCap = cap;
}

function outByte(b: u8): void {
  outReserve(1);
  store<u8>(outBuf + outLen, b);
  outLen += 1;
}

function outU32(v: u32): void {
  outReserve(4);
  store<u32>(outBuf + outLen, v);
  outLen += 4;
}

function outASCII(s: string): void {
  for (let i = 0; i < s.length; i++) outByte(<u8>s.charCodeAt(i));
}

function outDecimal(v: u64): void {
  if (v >= 10) outDecimal(v / 10);
  outByte(<u8>(48 + <u32>(v % 10)));
}

function packed(): i64 {
  if (outLen == 0) return 0;
  return <i64>((<u64>outBuf << 32) | <u64>outLen);
}

// bytesEqual compares n bytes at p with the ASCII string s.
function bytesEqual(p: usize, n: u32, s: string): bool {
  if (<i32>n != s.length) return false;
  for (let i = 0; i < s.length; i++) {
    if (load<u8>(p + i) != <u8>s.charCodeAt(i)) return false;
  }
  return true;
}

function initError(msg: string): i64 {
  outLen = 0;
  outASCII(msg);
  return packed();
}

// ferry_init reads max.bytes (required, decimal, 1 to 2^53).
export function ferry_init(ptr: i32, len: i32): i64 {
  let p = <usize>ptr;
  const n = load<u32>(p);
  p += 4;
  let found = false;
  for (let i: u32 = 0; i < n; i++) {
    const klen = load<u32>(p);
    const key = p + 4;
    p = key + klen;
    const vlen = load<u32>(p);
    const val = p + 4;
    p = val + vlen;
    if (!bytesEqual(key, klen, "max.bytes")) continue;
    if (vlen == 0 || vlen > 16) return initError("maxsize-as: max.bytes: not a number of bytes from 1 to 2^53");
    let v: u64 = 0;
    for (let j: u32 = 0; j < vlen; j++) {
      const c = load<u8>(val + j);
      if (c < 48 || c > 57) return initError("maxsize-as: max.bytes: not a number of bytes from 1 to 2^53");
      v = v * 10 + <u64>(c - 48);
    }
    if (v == 0 || v > (<u64>1 << 53)) return initError("maxsize-as: max.bytes: not a number of bytes from 1 to 2^53");
    maxBytes = v;
    found = true;
  }
  if (!found) return initError("maxsize-as: set wasm.config.max.bytes, the largest record (key, value and headers) in bytes");
  return 0;
}

// nullable returns the length of the i32-length-prefixed field at p (0
// for null, -1).
function nullableLen(p: usize): u32 {
  const n = load<i32>(p);
  return n < 0 ? 0 : <u32>n;
}

export function ferry_on_produce(ptr: i32, len: i32): i64 {
  let p = <usize>ptr;
  p += 4 + <usize>load<u32>(p); // topic
  p += 4; // partition
  const n = load<u32>(p);
  p += 4;
  outLen = 0;
  let changed = false;
  for (let i: u32 = 0; i < n; i++) {
    p += 16; // offset, timestamp
    const klen = nullableLen(p);
    p += 4 + <usize>klen;
    const vlen = nullableLen(p);
    p += 4 + <usize>vlen;
    let size: u64 = <u64>klen + <u64>vlen;
    const nh = load<u32>(p);
    p += 4;
    for (let h: u32 = 0; h < nh; h++) {
      const nlen = load<u32>(p);
      p += 4 + <usize>nlen;
      const hvlen = nullableLen(p);
      p += 4 + <usize>hvlen;
      size += <u64>nlen + <u64>hvlen;
    }
    if (size <= maxBytes) {
      if (changed) outByte(0); // KEEP
      continue;
    }
    if (!changed) {
      changed = true;
      outU32(n);
      for (let j: u32 = 0; j < i; j++) outByte(0);
    }
    outByte(3); // REJECT
    const at = outLen;
    outU32(0); // reason length, set below
    outASCII("maxsize-as: record of ");
    outDecimal(size);
    outASCII(" bytes (key, value and headers) is over max.bytes=");
    outDecimal(maxBytes);
    store<u32>(outBuf + at, <u32>(outLen - at - 4));
  }
  if (!changed) outLen = 0;
  return packed();
}
