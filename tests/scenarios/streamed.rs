//! Calls large enough that the shared-memory executor writes their outputs
//! with streaming stores (from the last-level cache ÷ the group's ranks:
//! 16 MiB for 2 ranks on a 32 MiB cache): random non-integer f32 values
//! and an odd element count, so shares and tails fall off every alignment,
//! and bit-exact comparison with a serial f32 reference summed in rank
//! order; the all-to-alls against the blocks cut from every rank's input.

use super::reference::{assert_bits, assert_replicated_ops, random_f32};
use rankmesh::{Collectives as _, GroupCoordinator, Runtime, Tensor};

/// Bytes of the largest data or unified cache sysfs lists for CPU 0, or
/// 32 MiB where it lists none (as the executor reads it).
fn last_level_cache() -> usize {
    let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache") else {
        return 32 << 20;
    };
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    dir.flatten()
        .filter(|e| read(e.path().join("type")).trim() != "Instruction")
        .filter_map(|e| {
            let level: u32 = read(e.path().join("level")).trim().parse().ok()?;
            let size = read(e.path().join("size"));
            let kib: usize = size.trim().strip_suffix('K')?.parse().ok()?;
            Some((level, kib << 10))
        })
        .max()
        .map_or(32 << 20, |(_, bytes)| bytes)
}

/// Elements per rank: past the threshold for 2 ranks (every op's output
/// streams at 2 and 3), at least 9 MiB, and 5 over a whole MiB.
fn elements() -> usize {
    let bytes = (9 << 20).max(last_level_cache() / 2 + (1 << 20));
    bytes.next_multiple_of(1 << 20) / 4 + 5
}

/// Rank `rank`'s values.
fn values(rank: usize, n: usize) -> Vec<f32> {
    random_f32((rank as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03), n)
}

pub fn run(rt: &Runtime) {
    let g = rt.world_group().unwrap();
    let p = g.size();
    let n = elements();
    let all: Vec<Vec<f32>> = (0..p).map(|r| values(r, n)).collect();
    assert_replicated_ops(&g, &all, [p - 1]);
    assert_all_to_alls(&g, &all);
}

/// all_to_all of every rank's whole input (its blocks of an odd element
/// count, so their ends fall off every alignment), then all_to_all_v with
/// uneven counts (rank `r` sends rank `s` a share that grows with `r + s`,
/// one block of them empty): each output checked bit for bit against the
/// blocks cut from every rank's input.
fn assert_all_to_alls(g: &GroupCoordinator<'_>, all: &[Vec<f32>]) {
    let (p, me) = (g.size(), g.rank_in_group());
    let n = all[0].len() - all[0].len() % p;
    let mine = Tensor::from_vec([n], all[me][..n].to_vec()).unwrap();
    let b = n / p;
    let want: Vec<f32> = (0..p)
        .flat_map(|s| all[s][me * b..][..b].to_vec())
        .collect();
    let got = g.all_to_all(&mine).unwrap();
    assert_bits(&got, &want, &format!("all_to_all of {n} f32 on {p} ranks"));

    // counts[r][s]: rows rank r sends rank s; row sums stay within n.
    let count = |r: usize, s: usize| match (r + s) % p {
        0 if p > 1 => 0,
        k => (n / p / p * (k + 1) + 3).min(n / p),
    };
    let sends: Vec<usize> = (0..p).map(|s| count(me, s)).collect();
    let recvs: Vec<usize> = (0..p).map(|r| count(r, me)).collect();
    let start = |r: usize, s: usize| (0..s).map(|t| count(r, t)).sum::<usize>();
    let total: usize = sends.iter().sum();
    let input = Tensor::from_vec([total], all[me][..total].to_vec()).unwrap();
    let want: Vec<f32> = (0..p)
        .flat_map(|r| all[r][start(r, me)..][..count(r, me)].to_vec())
        .collect();
    let got = g.all_to_all_v(&input, &sends, &recvs).unwrap();
    let what = format!("all_to_all_v of {total} f32 (counts {sends:?}) on {p} ranks");
    assert_bits(&got, &want, &what);
}
