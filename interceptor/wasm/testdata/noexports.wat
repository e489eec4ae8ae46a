;; Hostile: a module that exports nothing.
(module (memory 1) (func $f))
