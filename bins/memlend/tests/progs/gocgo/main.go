// A Go job linked with cgo (so dynamically, so the shim loads), whose heap
// is several times its budget: a 384 MiB slice rewritten three times and
// summed. Go reserves its arenas PROT_NONE and commits them with MAP_FIXED.
package main

/*
#include <stdlib.h>
*/
import "C"
import "fmt"

func main() {
	_ = C.malloc(1)
	a := make([]int64, 48<<20) // 384 MiB
	for p := 0; p < 3; p++ {
		for i := range a {
			a[i] = a[i]*31 + int64(i^p)
		}
	}
	var s int64
	for _, v := range a {
		s += v
	}
	fmt.Println("sum", s)
}
