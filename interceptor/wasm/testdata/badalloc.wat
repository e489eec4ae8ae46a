;; Hostile: ferry_alloc returns a pointer outside the module's memory.
(module
  (memory (export "memory") 1)
  (func (export "ferry_abi_v1"))
  (func (export "ferry_alloc") (param i32) (result i32) (i32.const 0x7ffffff0))
  (func (export "ferry_on_produce") (param i32 i32) (result i64) (i64.const 0)))
