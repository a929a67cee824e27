#!/usr/bin/env python3
"""Seeds for the nbd_handshake and nbd_command fuzz targets: a few valid
client byte streams, written into fuzz/corpus/<target>/seed-<name>.

nbd_handshake: what a client sends after the server's greeting (client
flags, then options). nbd_command: a stream of transmission requests.
All integers are big-endian, as on the wire (docs/nbd.md)."""

import os
import struct
import sys

IHAVEOPT = 0x49484156454F5054
REQUEST_MAGIC = 0x25609513

# Client flags.
C_FIXED_NEWSTYLE, C_NO_ZEROES = 1, 2
# Options.
EXPORT_NAME, ABORT, LIST, STARTTLS, INFO, GO, STRUCTURED_REPLY = 1, 2, 3, 5, 6, 7, 8
LIST_META_CONTEXT = 9
# Info types.
INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE = 1, 2, 3
# Commands and their flags.
READ, WRITE, DISC, FLUSH, TRIM, CACHE, WRITE_ZEROES, BLOCK_STATUS = 0, 1, 2, 3, 4, 5, 6, 7
FUA, NO_HOLE, DF, FAST_ZERO = 1, 2, 4, 16


def flags(v):
    return struct.pack(">I", v)


def option(code, data=b""):
    return struct.pack(">QII", IHAVEOPT, code, len(data)) + data


def info_request(name, *types):
    return struct.pack(">I", len(name)) + name + struct.pack(">H", len(types)) + struct.pack(
        ">%dH" % len(types), *types
    )


def request(cmd, cookie, offset, length, cmd_flags=0, payload=b""):
    return struct.pack(">IHHQQI", REQUEST_MAGIC, cmd_flags, cmd, cookie, offset, length) + payload


HANDSHAKE = {
    # What qemu-nbd and nbd-client usually send.
    "go-default": flags(3) + option(STRUCTURED_REPLY) + option(GO, info_request(b"")),
    # nbdinfo --list: list, then INFO on a named export, then GO.
    "list-info-go": flags(3)
    + option(STRUCTURED_REPLY)
    + option(LIST)
    + option(INFO, info_request(b"disk", INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE))
    + option(GO, info_request(b"disk", INFO_BLOCK_SIZE)),
    # The old way in, with and without the padding.
    "export-name": flags(C_FIXED_NEWSTYLE) + option(EXPORT_NAME, b"disk"),
    "export-name-no-zeroes": flags(3) + option(EXPORT_NAME, b""),
    # A client that is not fixed newstyle may only send OPT_EXPORT_NAME.
    "not-fixed-newstyle": flags(0) + option(EXPORT_NAME, b"disk"),
    "abort": flags(3) + option(ABORT),
    # Options answered with errors, then a GO.
    "errors-then-go": flags(3)
    + option(LIST_META_CONTEXT, info_request(b"", 0))
    + option(STARTTLS)
    + option(LIST, b"x")
    + option(STRUCTURED_REPLY, b"xy")
    + option(INFO, b"\x00\x00\x00\x04dis")
    + option(GO, info_request(b"nosuch"))
    + option(GO, info_request(b"")),
}

COMMAND = {
    "read": request(READ, 1, 0, 4096),
    "write-flush-disc": request(WRITE, 2, 4096, 16, payload=bytes(range(16)))
    + request(FLUSH, 3, 0, 0)
    + request(DISC, 4, 0, 0),
    "write-fua": request(WRITE, 5, 512, 512, FUA, payload=b"\xa5" * 512),
    "mixed": request(TRIM, 6, 0, 8192, FUA)
    + request(WRITE_ZEROES, 7, 8192, 4096, NO_HOLE)
    + request(WRITE_ZEROES, 8, 8192, 4096, FAST_ZERO)
    + request(CACHE, 9, 0, 65536)
    + request(READ, 10, 1 << 20, 512, DF)
    + request(BLOCK_STATUS, 11, 0, 4096)
    + request(99, 12, 0, 0),
    "read-past-end": request(READ, 13, (1 << 64) - 512, 4096),
}


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus")
    for target, seeds in (("nbd_handshake", HANDSHAKE), ("nbd_command", COMMAND)):
        d = os.path.join(root, target)
        os.makedirs(d, exist_ok=True)
        for name, data in seeds.items():
            assert len(data) <= 1500, name
            with open(os.path.join(d, "seed-" + name), "wb") as f:
                f.write(data)
        print(f"{target}: {len(seeds)} seeds in {os.path.relpath(d)}", file=sys.stderr)


if __name__ == "__main__":
    main()
