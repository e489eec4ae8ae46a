;; Hostile: ferry_on_produce claims 4 GiB - 1 of output at 0.
(module
  (memory (export "memory") 1)
  (global $in (mut i32) (i32.const 0))
  (global $size (mut i32) (i32.const 0))
  (func (export "ferry_abi_v1"))
  ;; ferry_alloc: the input goes at 64 KiB; memory grows to hold it twice
  ;; over (input, then output) plus a page.
  (func (export "ferry_alloc") (param $n i32) (result i32)
    (local $need i32)
    (local.set $need (i32.add (i32.const 2) (i32.shr_u (i32.mul (local.get $n) (i32.const 2)) (i32.const 16))))
    (if (i32.gt_u (local.get $need) (memory.size))
      (then (if (i32.eq (memory.grow (i32.sub (local.get $need) (memory.size))) (i32.const -1))
        (then (return (i32.const 0))))))
    (global.set $in (i32.const 65536))
    (global.set $size (local.get $n))
    (i32.const 65536))
  (func (export "ferry_on_produce") (param i32 i32) (result i64) (i64.const 0x00000000ffffffff)))
