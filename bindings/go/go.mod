module kdn.dev/kdn

go 1.19
