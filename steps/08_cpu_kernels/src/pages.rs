//! A model's int4 matrices on 2 MB pages, one after another: what lets dot4 and fma4 read weights at memory speed.
//!
//! A decode step streams every weight once, and at 4 KB pages each 4 KB it reads needs a new address translation —
//! in a virtual machine a nested page walk — while the kernels' prefetches run ahead. Measured on an Intel Xeon with
//! AMX (a KVM guest, 2 threads, 2026-12-05, 110 E2B-shaped [12288 × 1536] matrices, 1.2 GB, best of 5, one run):
//! dot4 read 20.2 GB/s from 4 KB pages, 24.9 GB/s from 2 MB pages — and 20.7 when only the words were on 2 MB pages
//! and the scales (an eighth of the bytes) in an allocation of their own on 4 KB pages. Hence one stretch for all.
//! Plain AVX-512 loads, no kernel, 2 threads over 1 GiB (same machine and day): 21.9 GB/s on 4 KB pages, 26.7 on
//! 2 MB pages. The engine with torch's own switch, `THP_MEM_ALLOC_ENABLE=1` (every allocation of 2 MB or more
//! aligned and advised), E2B int4, a decode step in a warm process: 70.7 ms without, 67.3 with — the small
//! matrices (an o_proj is 1.8 MB) and every linear's scales stayed on 4 KB pages; with this arena, 61.9.
//!
//! Linux backs an anonymous map with 2 MB pages where asked (`madvise(MADV_HUGEPAGE)`, honoured when
//! /sys/kernel/mm/transparent_hugepage/enabled is `always` or `madvise`), for its 2 MB-aligned pages. So each map
//! starts on a 2 MB boundary, and what that costs is at most one partly used 2 MB page a map (the one its last piece
//! ends in). Where the advice is refused (`never`), or off Linux, the pages are 4 KB ones and the kernels read them
//! at 4 KB pages' speed.
use std::sync::Arc;

use memmap2::MmapMut;
use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};

const HUGE_PAGE: i64 = 2 << 20;
/// A map's size: a few layers' matrices (E2B's gate and up together are 10.6 MB). A piece of more than a quarter of
/// it (the tied head) gets a map of its own.
const CHUNK: i64 = 64 << 20;
/// Where pieces start: a cache line, as the kernels' 64-byte loads want.
const ALIGN: i64 = 64;

// --8<-- [start:arena]
/// Memory for a model's int4 matrices, on 2 MB pages where Linux grants them, handed out in the order they are
/// loaded — the order a decode step reads them — so one matrix's last page and the next one's first are
/// neighbours, and a small matrix (an o_proj, 1.8 MB) shares huge pages with the next instead of sitting alone on
/// 4 KB ones. Nothing is handed back: a model's matrices live as long as the model.
#[derive(Default)]
pub struct Arena {
    /// The map pieces are cut from now, a uint8 view of all of it, and how much of it is taken.
    current: Option<(Arc<MmapMut>, Tensor, i64)>,
}

impl Arena {
    pub fn new() -> Arena {
        Arena::default()
    }

    /// `bytes` of zeros as a uint8 tensor, and the map it is a view of: whoever keeps the view keeps the map (the
    /// view does not).
    pub fn take(&mut self, bytes: i64) -> Result<(Arc<MmapMut>, Tensor)> {
        if bytes > CHUNK / 4 {
            return huge_paged_map(bytes);
        }
        let fits = matches!(&self.current, Some((_, _, used)) if used + bytes <= CHUNK);
        if !fits {
            let (map, all) = huge_paged_map(CHUNK)?;
            self.current = Some((map, all, 0));
        }
        let (map, all, used) = self.current.as_mut().expect("a map was made above");
        let piece = all.f_narrow(0, *used, bytes)?;
        *used = aligned(*used + bytes);
        Ok((Arc::clone(map), piece))
    }
}
// --8<-- [end:arena]

/// `at` rounded up to a multiple of `ALIGN`.
fn aligned(at: i64) -> i64 {
    (at + ALIGN - 1) / ALIGN * ALIGN
}

// --8<-- [start:map]
/// A fresh anonymous map of `bytes` (fresh pages: the advice decides how each is backed when first written, where
/// memory from malloc may have been written on 4 KB pages before), starting on a 2 MB boundary, its whole 2 MB pages
/// advised huge; and a uint8 view of those bytes. The map is 2 MB longer: its skipped head is never touched, so it
/// never takes memory, and a tail short of a whole page stays on 4 KB pages. A 2 MB page is backed whole once any
/// of it is written: an arena's map costs at most the unused part of the page its last piece ends in. Where the
/// advice is refused (transparent huge pages `never`) the pages are 4 KB ones.
fn huge_paged_map(bytes: i64) -> Result<(Arc<MmapMut>, Tensor)> {
    let mut map = MmapMut::map_anon((bytes + HUGE_PAGE) as usize)
        .map_err(|e| Error::OutOfMemory(format!("{bytes} bytes for int4 weights: an anonymous map failed: {e}")))?;
    let skip = (HUGE_PAGE - map.as_ptr() as i64 % HUGE_PAGE) % HUGE_PAGE;
    #[cfg(target_os = "linux")]
    if bytes >= HUGE_PAGE {
        let _ = map.advise_range(memmap2::Advice::HugePage, skip as usize, (bytes / HUGE_PAGE * HUGE_PAGE) as usize);
    }
    let at = map[skip as usize..].as_mut_ptr();
    // SAFETY: [at, at + bytes) lies inside the map, which lives as long as the Arc returned with the view; every
    // view cut from it is kept beside that Arc (OwnLinear holds both).
    let all = unsafe { Tensor::f_from_blob(at, &[bytes], &[1], Kind::Uint8, Device::Cpu)? };
    Ok((Arc::new(map), all))
}
// --8<-- [end:map]

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines /proc/self/smaps gives for the mapping `buffer` starts in (Linux), for the test that the advice took;
    /// `None` where they cannot be read.
    fn smaps_of(buffer: &Tensor) -> Option<Vec<String>> {
        let start = buffer.data_ptr() as usize;
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut found: Option<Vec<String>> = None;
        for line in smaps.lines() {
            let range = line.split_once(' ').and_then(|(range, _)| range.split_once('-'));
            if let Some((a, b)) =
                range.and_then(|(a, b)| Some((usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?)))
            {
                if found.is_some() {
                    break; // the next mapping's header
                }
                if a <= start && start < b {
                    found = Some(Vec::new());
                }
            } else if let Some(lines) = found.as_mut() {
                lines.push(line.to_string());
            }
        }
        found
    }

    #[test]
    fn pieces_follow_each_other_on_huge_page_boundaries_and_are_as_long_as_asked() {
        let mut arena = Arena::new();
        let mut last_end = None;
        for bytes in [1000, HUGE_PAGE, 3 * HUGE_PAGE + 4096, 0, 100] {
            let (_map, mut piece) = arena.take(bytes).unwrap();
            assert_eq!(piece.size(), [bytes]);
            if bytes == 0 {
                continue; // an empty tensor has no address
            }
            let at = piece.data_ptr() as i64;
            match last_end {
                None => assert_eq!(at % HUGE_PAGE, 0, "a map starts on a 2 MB boundary"),
                Some(end) => assert_eq!(at, aligned(end), "the next piece follows"),
            }
            last_end = Some(at + bytes);
            let _ = piece.f_fill_(1).unwrap(); // every byte is writable
            assert_eq!(piece.sum(Kind::Int64).int64_value(&[]), bytes);
        }
        // one larger than a quarter of a map gets one of its own; the next small one goes on after the last
        let (_, big) = arena.take(CHUNK / 4 + 1).unwrap();
        assert_eq!(big.data_ptr() as i64 % HUGE_PAGE, 0);
        let (_, next) = arena.take(64).unwrap();
        assert_eq!(next.data_ptr() as i64, aligned(last_end.unwrap()));
        // and one that does not fit what is left starts a new map
        let (_, fresh) = arena.take(CHUNK / 4).unwrap();
        let (_, after) = arena.take(CHUNK / 4 * 3).unwrap();
        assert_eq!(after.data_ptr() as i64 % HUGE_PAGE, 0);
        assert_ne!(after.data_ptr(), fresh.data_ptr());
    }

    #[test]
    fn memory_the_system_cannot_give_is_a_memory_error_naming_the_bytes() {
        // 1 PB: more than a 64-bit process's address space holds, whatever the system's overcommit setting
        let Err(Error::OutOfMemory(msg)) = Arena::new().take(1 << 50) else { panic!("a 1 PB map must fail") };
        assert!(msg.starts_with("1125899906842624 bytes for int4 weights: an anonymous map failed"), "{msg}");
    }

    #[test]
    fn its_whole_pages_are_advised_huge_and_granted_where_linux_can() {
        let read = |name: &str| std::fs::read_to_string(format!("/sys/kernel/mm/transparent_hugepage/{name}"));
        let (Ok(mode), Ok(defrag)) = (read("enabled"), read("defrag")) else {
            eprintln!("skipped: this kernel has no transparent huge pages (/sys/kernel/mm/transparent_hugepage)");
            return;
        };
        let (_map, mut piece) = Arena::new().take(3 * HUGE_PAGE + 4096).unwrap();
        let _ = piece.f_fill_(1).unwrap();
        let lines = smaps_of(&piece).expect("/proc/self/smaps names the piece's map");
        let field = |name: &str| lines.iter().find_map(|l| l.strip_prefix(name)).unwrap_or_default().to_string();
        // the advice reached Linux: the mapping carries its flag (`hg`) whatever Linux then grants
        assert!(field("VmFlags:").split_whitespace().any(|f| f == "hg"), "not advised: {lines:?}");
        // and where Linux makes a fault in advised memory find a 2 MB page (compacting memory if it must), it did:
        // at least one of the three whole pages (Linux falls back to 4 KB pages when compaction finds none)
        let granted = mode.contains("[always]") || mode.contains("[madvise]");
        let compacts = ["[always]", "[madvise]", "[defer+madvise]"].iter().any(|d| defrag.contains(d));
        if granted && compacts {
            let kb: i64 = field("AnonHugePages:").trim().trim_end_matches("kB").trim().parse().unwrap();
            assert!(kb * 1024 >= HUGE_PAGE, "{kb} kB on 2 MB pages ({lines:?})");
        } else {
            eprintln!("2 MB pages not checked: enabled {}, defrag {}", mode.trim(), defrag.trim());
        }
    }
}
