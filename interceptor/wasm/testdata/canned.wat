;; Returns, from every call, the value of its only configuration entry
;; (wasm.config.out): the tests write any output bytes there.
(module
  (memory (export "memory") 1)
  (global $cfg (mut i32) (i32.const 0))
  (global $cfglen (mut i32) (i32.const 0))
  (func (export "ferry_abi_v1"))
  ;; a bump allocator from 1 KiB; memory grows as needed
  (global $next (mut i32) (i32.const 1024))
  (func (export "ferry_alloc") (param $n i32) (result i32)
    (local $p i32) (local $end i32)
    (local.set $p (global.get $next))
    (local.set $end (i32.add (local.get $p) (local.get $n)))
    (if (i32.gt_u (local.get $end) (i32.mul (memory.size) (i32.const 65536)))
      (then (if (i32.eq (memory.grow (i32.add (i32.const 1) (i32.shr_u (i32.sub (local.get $end) (i32.mul (memory.size) (i32.const 65536))) (i32.const 16)))) (i32.const -1))
        (then (return (i32.const 0))))))
    (global.set $next (local.get $end))
    (local.get $p))
  (func (export "ferry_init") (param $p i32) (param $n i32) (result i64)
    (global.set $cfg (local.get $p))
    (global.set $cfglen (local.get $n))
    (i64.const 0))
  ;; config: u32 1, u32 3, "out", u32 vlen, value: the value is at +15
  (func $out (result i64)
    (i64.or
      (i64.shl (i64.extend_i32_u (i32.add (global.get $cfg) (i32.const 15))) (i64.const 32))
      (i64.extend_i32_u (i32.sub (global.get $cfglen) (i32.const 15)))))
  (func (export "ferry_on_produce") (param i32 i32) (result i64) (call $out))
  (func (export "ferry_on_fetch") (param i32 i32) (result i64) (call $out)))
