//! Can the preload shim load into the program at all? `LD_PRELOAD` is read
//! by the dynamic loader, so a statically linked program (a pure-Go binary,
//! one linked against musl with `-static`) never loads it and gets no far
//! memory, whatever `memlend run` does. We look before starting it and say
//! so, with what the user can do instead, rather than run it and report
//! nothing.
//!
//! The test is the ELF program header `PT_INTERP` (the loader's path): a
//! dynamically linked executable has one, a static one does not (a static
//! PIE is `ET_DYN` with no `PT_INTERP` too). Scripts (`#!`) and anything
//! not ELF are left alone: their interpreter is what runs, and it is
//! usually dynamic.

use std::io::Read;
use std::path::{Path, PathBuf};

/// The most program headers we read (`e_phnum` is a u16; PN_XNUM, 0xffff,
/// means "more, counted elsewhere", which no executable needs).
const PHNUM_MAX: usize = 0xfffe;
/// The most bytes of a file we read to find them: headers sit at the front.
const HEAD_BYTES_MAX: usize = 1 << 20;
const PT_INTERP: u32 = 3;

/// What the loader will make of a program.
#[derive(Debug, PartialEq, Eq)]
pub enum Loadable {
    /// Dynamically linked: the shim loads.
    Dynamic,
    /// Statically linked: the shim never loads.
    Static,
    /// Not ELF, or not one we read (a script, 32-bit, big-endian): left to run.
    Unknown,
}

/// Look at `file`'s first bytes (at most `HEAD_BYTES_MAX`).
pub fn of_file(file: &Path) -> std::io::Result<Loadable> {
    let mut head = Vec::new();
    std::fs::File::open(file)?.take(HEAD_BYTES_MAX as u64).read_to_end(&mut head)?;
    Ok(of_bytes(&head))
}

/// Decode an ELF64 little-endian header and its program headers. Every
/// offset and count is checked against `bytes`; anything out of bounds is
/// `Unknown`, never a panic.
pub fn of_bytes(bytes: &[u8]) -> Loadable {
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return Loadable::Unknown;
    }
    let u16_at = |at: usize| bytes.get(at..at + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |at: usize| {
        bytes.get(at..at + 4).map(|b| u32::from_le_bytes(b.try_into().unwrap_or([0; 4])))
    };
    let u64_at = |at: usize| {
        bytes.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
    };
    let (Some(kind), Some(phoff), Some(phentsize), Some(phnum)) =
        (u16_at(16), u64_at(32), u16_at(54), u16_at(56))
    else {
        return Loadable::Unknown;
    };
    // ET_EXEC or ET_DYN only; program headers of the ELF64 size.
    if !(kind == 2 || kind == 3) || phentsize != 56 || phnum as usize > PHNUM_MAX {
        return Loadable::Unknown;
    }
    let Ok(phoff) = usize::try_from(phoff) else { return Loadable::Unknown };
    // Bounded by `phnum`, itself at most PHNUM_MAX.
    for i in 0..phnum as usize {
        let Some(at) = i.checked_mul(56).and_then(|o| o.checked_add(phoff)) else {
            return Loadable::Unknown;
        };
        match u32_at(at) {
            Some(PT_INTERP) => return Loadable::Dynamic,
            Some(_) => {}
            None => return Loadable::Unknown,
        }
    }
    Loadable::Static
}

/// Where `cmd` is, as the spawn would find it: a path with a slash as is,
/// else the first executable of that name on `PATH`.
pub fn resolve(cmd: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if cmd.contains('/') {
        return Some(PathBuf::from(cmd));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(cmd)).find(|p| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// Why `memlend run` will not start a static program, and what to do.
pub fn static_refusal(file: &Path) -> String {
    format!(
        "{} is statically linked (its ELF file names no dynamic loader), so LD_PRELOAD cannot \
         load memlend's shim into it and it would get no far memory. What works instead: \
         build it dynamically linked (Go: CGO_ENABLED=1 and any cgo import, or \
         -linkmode=external), or give the whole machine far memory as swap: export memory from \
         memlendd over NBD and swap on it through nbd-client (docs/run.md, \"Programs the shim \
         cannot load into\"). --allow-static runs it anyway, without far memory.",
        file.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_is_dynamic_and_a_script_is_unknown() {
        let me = std::env::current_exe().expect("current_exe");
        assert_eq!(of_file(&me).expect("read"), Loadable::Dynamic);
        assert_eq!(of_bytes(b"#!/bin/sh\necho hi\n"), Loadable::Unknown);
    }

    /// An ELF64 header with `phnum` program headers of the given types.
    fn elf(types: &[u32]) -> Vec<u8> {
        let mut b = vec![0u8; 64 + 56 * types.len()];
        b[..6].copy_from_slice(b"\x7fELF\x02\x01");
        b[16..18].copy_from_slice(&2u16.to_le_bytes());
        b[32..40].copy_from_slice(&64u64.to_le_bytes());
        b[54..56].copy_from_slice(&56u16.to_le_bytes());
        b[56..58].copy_from_slice(&(types.len() as u16).to_le_bytes());
        for (i, t) in types.iter().enumerate() {
            b[64 + 56 * i..68 + 56 * i].copy_from_slice(&t.to_le_bytes());
        }
        b
    }

    #[test]
    fn an_interpreter_header_makes_it_dynamic() {
        assert_eq!(of_bytes(&elf(&[6, PT_INTERP, 1])), Loadable::Dynamic);
        assert_eq!(of_bytes(&elf(&[6, 1, 1, 4])), Loadable::Static);
    }

    #[test]
    fn headers_that_point_outside_the_file_are_unknown() {
        let mut b = elf(&[1, 1]);
        b.truncate(64 + 56); // the second header is cut off
        assert_eq!(of_bytes(&b), Loadable::Unknown);
        let mut b = elf(&[1]);
        b[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(of_bytes(&b), Loadable::Unknown);
        let mut b = elf(&[1]);
        b[56..58].copy_from_slice(&0xffffu16.to_le_bytes());
        assert_eq!(of_bytes(&b), Loadable::Unknown);
    }

    #[test]
    fn random_bytes_never_panic() {
        // A cheap fuzz: every prefix and many random mutations of a header.
        let base = elf(&[6, PT_INTERP, 1]);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut b = base.clone();
            let at = seed as usize % b.len();
            b[at] = (seed >> 32) as u8;
            b.truncate((seed >> 40) as usize % (base.len() + 1));
            let _ = of_bytes(&b);
        }
    }
}
