//! `rankmesh bench` output through parsers written the way the common
//! consumers of nccl-tests output read it, for every collective, with and
//! without every rankmesh flag (`--baseline`, `--stats`, `--group`):
//! - header-column readers (superbench: the columns named by the first
//!   header with `time` and `busbw` after the last `out-of-place` line, rows
//!   up to `Out of bounds values`, counted from the end in in-place mode);
//! - last-column readers (`awk '{print $(NF-1)}'`: the in-place busbw);
//! - position readers (13 whitespace-separated fields per row);
//! - the footer grep (`grep '# Avg bus bandwidth' | awk '{print $NF}'`).
//!
//! Every parser must read the same numbers as the plain 13-column rows.

mod support;

use rankmesh::tools::bench::entries;
use std::path::Path;

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_rankmesh"))
}

/// Lines that are not comments and start with a digit: nccl-tests rows.
fn data_rows(out: &str) -> Vec<Vec<&str>> {
    out.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| {
            f.first()
                .is_some_and(|t| t.starts_with(|c: char| c.is_ascii_digit()))
        })
        .collect()
}

/// (size, time, algbw, busbw) per row, read as superbench's nccl-bw does.
fn superbench(out: &str, in_place: bool) -> Vec<(u64, f64, f64, f64)> {
    let lines: Vec<&str> = out.lines().collect();
    let start = lines
        .iter()
        .rposition(|l| l.contains("out-of-place"))
        .expect("an out-of-place header");
    let end = lines
        .iter()
        .position(|l| l.contains("Out of bounds values"))
        .expect("an out-of-bounds footer");
    let content = &lines[start + 1..end];
    let header: Vec<&str> = content
        .iter()
        .find(|l| l.contains("time") && l.contains("busbw"))
        .expect("a column header")[1..]
        .split_whitespace()
        .collect();
    let n = header.len() as isize;
    let from_start = |name: &str| header.iter().position(|h| *h == name).unwrap() as isize - n;
    let from_end = |name: &str| -1 - header.iter().rev().position(|h| *h == name).unwrap() as isize;
    let col = |name: &str| {
        if in_place {
            from_end(name)
        } else {
            from_start(name)
        }
    };
    let size = header.iter().position(|h| *h == "size").unwrap();
    let (time, algbw, busbw) = (col("time"), col("algbw"), col("busbw"));
    content
        .iter()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| {
            f.first()
                .is_some_and(|t| t.starts_with(|c: char| c.is_ascii_digit()))
        })
        .map(|f| {
            let at = |i: isize| f[(f.len() as isize + i) as usize];
            (
                f[size].parse().unwrap(),
                at(time).parse().unwrap(),
                at(algbw).parse().unwrap(),
                at(busbw).parse().unwrap(),
            )
        })
        .collect()
}

fn check_parsers(what: &str, out: &str, rows_expected: usize) {
    let rows = data_rows(out);
    assert_eq!(rows.len(), rows_expected, "{what}: rows\n{out}");
    for r in &rows {
        assert_eq!(r.len(), 13, "{what}: 13 fields: {r:?}\n{out}");
        for i in [0, 1, 4, 5, 6, 7, 9, 10, 11] {
            assert!(r[i].parse::<f64>().is_ok(), "{what}: field {i} of {r:?}");
        }
        assert_eq!((r[8], r[12]), ("0", "0"), "{what}: #wrong");
    }
    let number = |s: &str| s.parse::<f64>().unwrap();
    for (in_place, cols) in [(false, [5, 6, 7]), (true, [9, 10, 11])] {
        let sb = superbench(out, in_place);
        assert_eq!(sb.len(), rows.len(), "{what}: superbench rows");
        for (got, r) in sb.iter().zip(&rows) {
            let want = (
                number(r[0]) as u64,
                number(r[cols[0]]),
                number(r[cols[1]]),
                number(r[cols[2]]),
            );
            assert_eq!(*got, want, "{what}: superbench, in_place={in_place}");
        }
    }
    for r in &rows {
        assert_eq!(r[r.len() - 2], r[11], "{what}: $(NF-1) is in-place busbw");
    }
    let avg: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("# Avg bus bandwidth"))
        .collect();
    assert_eq!(avg.len(), 1, "{what}: one average line\n{out}");
    let last = avg[0].split_whitespace().last().unwrap();
    assert!(last.parse::<f64>().is_ok(), "{what}: $NF of {:?}", avg[0]);
}

#[test]
fn every_collective_parses_with_and_without_rankmesh_flags() {
    for coll in entries::ALL.iter().map(|e| e.name()) {
        let dtype = if coll == "broadcast_object" {
            "uint8"
        } else {
            "float"
        };
        let base = [
            coll, "-b", "1K", "-e", "16K", "-f", "4", "-n", "2", "-w", "1", "-d", dtype,
        ];
        let plain = support::mpirun(4, exe(), &[&["bench"][..], &base].concat(), &[]);
        assert!(plain.ok(), "{coll}: {}", plain.describe());
        check_parsers(coll, &plain.stdout, 3);

        let flags = ["--baseline", "mpi", "--stats", "--group", "tp", "--tp", "2"];
        let all = support::mpirun(4, exe(), &[&["bench"][..], &base, &flags].concat(), &[]);
        assert!(all.ok(), "{coll} with flags: {}", all.describe());
        let out = &all.stdout;
        for table in [
            "# rankmesh --baseline",
            "# rankmesh --stats",
            "# Group tp:1",
        ] {
            assert!(out.contains(table), "{coll}: {table} missing\n{out}");
        }
        // Two TP groups of 2, three sizes each.
        check_parsers(&format!("{coll} with flags"), out, 6);
    }
}

#[test]
fn sendrecv_names_the_operator() {
    let job = support::mpirun(
        2,
        exe(),
        &[
            "bench", "sendrecv", "-b", "8", "-e", "8", "-n", "1", "-w", "0", "-o", "max",
        ],
        &[],
    );
    assert!(job.ok(), "{}", job.describe());
    let rows = data_rows(&job.stdout);
    assert_eq!(rows[0][3], "max", "nccl-tests prints -o for sendrecv");
}
