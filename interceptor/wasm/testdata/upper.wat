;; Upper-cases the ASCII letters of every record's value (REPLACE with the
;; record's own key and headers), at produce and fetch.
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
  ;; skip32 returns the position after an i32 length (-1: null) and its bytes
  (func $skip (param $p i32) (result i32)
    (local $n i32)
    (local.set $n (i32.load (local.get $p)))
    (if (result i32) (i32.eq (local.get $n) (i32.const -1))
      (then (i32.add (local.get $p) (i32.const 4)))
      (else (i32.add (local.get $p) (i32.add (i32.const 4) (local.get $n))))))
  (func $run (param $ptr i32) (param $len i32) (result i64)
    (local $p i32) (local $o i32) (local $out i32) (local $n i32) (local $i i32)
    (local $start i32) (local $v i32) (local $vend i32) (local $h i32) (local $c i32)
    (local.set $out (i32.add (local.get $ptr) (local.get $len)))
    ;; skip topic and partition
    (local.set $p (i32.add (i32.add (local.get $ptr) (i32.const 8)) (i32.load (local.get $ptr))))
    (local.set $n (i32.load (local.get $p)))
    (local.set $p (i32.add (local.get $p) (i32.const 4)))
    (i32.store (local.get $out) (local.get $n))
    (local.set $o (i32.add (local.get $out) (i32.const 4)))
    (block $done (loop $rec
      (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
      (local.set $start (i32.add (local.get $p) (i32.const 16)))   ;; after offset, timestamp
      (local.set $v (call $skip (local.get $start)))                 ;; the value's length
      (local.set $p (call $skip (local.get $v)))                     ;; the header count
      (local.set $vend (local.get $p))
      (local.set $h (i32.load (local.get $p)))
      (local.set $p (i32.add (local.get $p) (i32.const 4)))
      (block $hd (loop $hl
        (br_if $hd (i32.eqz (local.get $h)))
        (local.set $p (i32.add (local.get $p) (i32.add (i32.const 4) (i32.load (local.get $p)))))
        (local.set $p (call $skip (local.get $p)))
        (local.set $h (i32.sub (local.get $h) (i32.const 1)))
        (br $hl)))
      ;; upper-case the value's bytes in place
      (local.set $v (i32.add (local.get $v) (i32.const 4)))
      (block $ud (loop $ul
        (br_if $ud (i32.ge_u (local.get $v) (local.get $vend)))
        (local.set $c (i32.load8_u (local.get $v)))
        (if (i32.and (i32.ge_u (local.get $c) (i32.const 97)) (i32.le_u (local.get $c) (i32.const 122)))
          (then (i32.store8 (local.get $v) (i32.sub (local.get $c) (i32.const 32)))))
        (local.set $v (i32.add (local.get $v) (i32.const 1)))
        (br $ul)))
      ;; REPLACE, then the record from its key to its end
      (i32.store8 (local.get $o) (i32.const 1))
      (memory.copy (i32.add (local.get $o) (i32.const 1)) (local.get $start) (i32.sub (local.get $p) (local.get $start)))
      (local.set $o (i32.add (local.get $o) (i32.add (i32.const 1) (i32.sub (local.get $p) (local.get $start)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $rec)))
    (i64.or (i64.shl (i64.extend_i32_u (local.get $out)) (i64.const 32))
      (i64.extend_i32_u (i32.sub (local.get $o) (local.get $out)))))
  (func (export "ferry_on_produce") (param i32 i32) (result i64) (call $run (local.get 0) (local.get 1)))
  (func (export "ferry_on_fetch") (param i32 i32) (result i64) (call $run (local.get 0) (local.get 1))))
