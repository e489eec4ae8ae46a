;; ferry_init refuses its configuration with a message.
(module
  (memory (export "memory") 1)
  (data (i32.const 16) "bad config: want mode")
  (func (export "ferry_abi_v1"))
  (func (export "ferry_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "ferry_init") (param i32 i32) (result i64) (i64.const 0x0000001000000015))
  (func (export "ferry_on_produce") (param i32 i32) (result i64) (i64.const 0)))
