"""Shared anonymous memory across forks: the parent writes MiB of a shared
mapping, three children each check every page and write their third, and
the parent checks every child's writes. Prints one line to compare."""
import mmap
import os
import sys

mib = int(sys.argv[1])
size = mib << 20
page = 4096
m = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)


def word(i):
    return (i * 2654435761 % (1 << 64)).to_bytes(8, "little")


for i in range(0, size, page):
    m[i:i + 8] = word(i)
children = []
for k in range(3):
    pid = os.fork()
    if pid == 0:
        bad = sum(m[i:i + 8] != word(i) for i in range(0, size, page))
        for i in range(k * page, size, 3 * page):
            m[i + 8:i + 16] = (k + 1).to_bytes(8, "little")
        os._exit(1 if bad else 0)
    children.append(pid)
ok = all(os.waitpid(p, 0)[1] == 0 for p in children)
bad = sum(
    m[i + 8:i + 16] != ((i // page) % 3 + 1).to_bytes(8, "little")
    for i in range(0, size, page)
)
print(f"{mib} MiB shared: children {'read every page' if ok else 'FAILED'}, parent found {bad} bad pages")
