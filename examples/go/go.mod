module kdn.dev/example

go 1.19

require kdn.dev/kdn v0.0.0

replace kdn.dev/kdn => ../../bindings/go
