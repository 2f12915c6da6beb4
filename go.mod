module github.com/vmipam/vmipam

go 1.26
