// A Go job over a skewed working set, for bench/jobs.py, the same work as
// bench/jobs/jvm/KvJob.java: --size bytes of 4 KiB records ([]int64 of
// 512 on the Go heap), keys by YCSB's scrambled zipfian, 95% reads that
// check a whole record, 5% updates of a whole record. Built with cgo, so
// it is dynamically linked and memlend's shim loads into it (a pure-Go
// binary is static: `memlend run` refuses it, docs/run.md).
package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"flag"
	"fmt"
	"math"
	"math/rand"
	"os"
	"sort"
	"time"
)

const (
	words      = 512
	items      = 10_000_000_000
	theta      = 0.99
	zetan      = 26.46902820178302
	samplesMax = 4_000_000
)

var (
	alpha   = 1.0 / (1.0 - theta)
	eta     = (1 - math.Pow(2.0/items, 1-theta)) / (1 - (1+math.Pow(0.5, theta))/zetan)
	halfPow = 1.0 + math.Pow(0.5, theta)
)

func base(id int64, j int) int64 {
	x := uint64(id)*0x9E3779B97F4A7C15 + uint64(j)
	x ^= x >> 29
	return int64(x * 0xBF58476D1CE4E5B9)
}

func fnv(v uint64) uint64 {
	h := uint64(0xCBF29CE484222325)
	for i := 0; i < 8; i++ {
		h ^= v & 0xFF
		v >>= 8
		h *= 1099511628211
	}
	s := int64(h)
	if s < 0 && s != math.MinInt64 {
		s = -s
	}
	return uint64(s)
}

func key(rng *rand.Rand, records int) int {
	u := rng.Float64()
	uz := u * zetan
	var rank uint64
	switch {
	case uz < 1.0:
		rank = 0
	case uz < halfPow:
		rank = 1
	default:
		rank = uint64(items * math.Pow(eta*u-eta+1, alpha))
	}
	return int(fnv(rank) % uint64(records))
}

func check(r []int64, id int) string {
	if r[0] != int64(id) {
		return fmt.Sprintf("record %d holds id %d", id, r[0])
	}
	for j := 2; j < words; j++ {
		if r[j] != base(int64(id), j)+r[1] {
			return fmt.Sprintf("record %d word %d is wrong", id, j)
		}
	}
	return ""
}

func run(recs [][]int64, rng *rand.Rand, seconds float64, lat []int64, updates *int64) (int64, string) {
	end := time.Now().Add(time.Duration(seconds * 1e9))
	var ops, sink int64
	for {
		if ops&63 == 0 && time.Now().After(end) {
			break
		}
		t := time.Now()
		id := key(rng, len(recs))
		r := recs[id]
		if rng.Intn(100) < 95 {
			if e := check(r, id); e != "" {
				return ops, e
			}
			for _, v := range r {
				sink += v
			}
		} else {
			r[1]++
			for j := 2; j < words; j++ {
				r[j]++
			}
			*updates++
		}
		if lat != nil && ops < int64(len(lat)) {
			lat[ops] = int64(time.Since(t))
		}
		ops++
	}
	if sink == 42 {
		fmt.Fprint(os.Stderr, "")
	}
	return ops, ""
}

func main() {
	size := flag.Int64("size", 512<<20, "bytes of records")
	seconds := flag.Float64("seconds", 20, "timed phase")
	warm := flag.Float64("warm-seconds", 20, "warm-up")
	seed := flag.Int64("seed", 1, "key seed")
	flag.Parse()
	_ = C.malloc(1) // links libc: the binary is dynamic
	rng := rand.New(rand.NewSource(*seed))
	records := int(*size / (words * 8))
	t0 := time.Now()
	recs := make([][]int64, records)
	for id := range recs {
		r := make([]int64, words)
		r[0] = int64(id)
		for j := 2; j < words; j++ {
			r[j] = base(int64(id), j)
		}
		recs[id] = r
	}
	buildS := time.Since(t0).Seconds()
	var updates int64
	_, errText := run(recs, rng, *warm, nil, &updates)
	lat := make([]int64, samplesMax)
	t1 := time.Now()
	ops, e := run(recs, rng, *seconds, lat, &updates)
	took := time.Since(t1).Seconds()
	if errText == "" {
		errText = e
	}
	var counted int64
	for id := 0; id < records && errText == ""; id++ {
		counted += recs[id][1]
		errText = check(recs[id], id)
	}
	if errText == "" && counted != updates {
		errText = fmt.Sprintf("records count %d updates, %d were made", counted, updates)
	}
	n := int(min(ops, samplesMax))
	s := lat[:n]
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(f float64) float64 {
		if n == 0 {
			return 0
		}
		return float64(s[int(float64(n)*f)]) / 1e3
	}
	errs := ""
	if errText != "" {
		errs = fmt.Sprintf("%q", errText)
	}
	fmt.Printf("{\"ops\":%d,\"seconds\":%.3f,\"ops_per_s\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f,"+
		"\"p999_us\":%.1f,\"unit\":\"record\",\"rows\":%d,\"build_s\":%.2f,\"verified\":%t,\"errors\":[%s]}\n",
		ops, took, float64(ops)/took, q(0.5), q(0.99), q(0.999), records, buildS, errText == "", errs)
	if errText != "" {
		os.Exit(1)
	}
}
