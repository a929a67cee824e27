module gokv

go 1.21
