// A Node.js job: three million small objects on the V8 heap (reserved
// PROT_NONE, committed with mprotect), read twice and summed.
const n = 3_000_000;
const a = [];
for (let i = 0; i < n; i++) a.push({ k: i, v: "x" + (i * 7919 % 100003) });
let s = 0;
for (let p = 0; p < 2; p++) for (let i = 0; i < n; i++) s = (s + a[i].k * 31 + a[i].v.length) % 1000000007;
console.log("sum", s);
