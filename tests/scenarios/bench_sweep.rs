//! Every benchmarked collective, dtype and reduction validated with `-c 1`:
//! the harness's expected data must match what the collectives produce.

use rankmesh::tools::bench::entries::{self, Entry};
use rankmesh::tools::bench::{self, Average, BenchConfig, GroupChoice};
use rankmesh::{op::Op, DType, ReduceOp, Runtime};

fn config(op: &'static Entry, dtype: DType, redop: ReduceOp, root: usize) -> BenchConfig {
    BenchConfig {
        op,
        min_bytes: 8,
        max_bytes: 4096,
        step_bytes: 0,
        step_factor: 8,
        iters: 2,
        warmup: 1,
        agg: 1,
        cycles: 1,
        check: 1,
        redop,
        dtype,
        root,
        // The uneven entries skewed, so validation sees uneven counts.
        skew: if matches!(op.op, Op::AllToAllV | Op::AllGatherV) {
            0.5
        } else {
            0.0
        },
        blocking: 0,
        average: Average::Mean,
        group: GroupChoice::World,
        tp: 1,
        sp: 1,
        device: false,
        baseline: true,
        stats: true,
        corrupt: false,
        min_bw: None,
        progress: false,
        register: 0,
    }
}

pub fn run(rt: &Runtime) {
    let p = rt.size();
    let mut runs = 0;
    for op in &entries::ALL {
        let dtypes: Vec<DType> = if op.op == Op::BroadcastObject {
            vec![DType::U8]
        } else {
            DType::ALL.to_vec()
        };
        let redops: &[ReduceOp] = if op.reduces() {
            &ReduceOp::ALL
        } else {
            &[ReduceOp::Sum]
        };
        for &dtype in &dtypes {
            for &redop in redops {
                let root = if op.rooted() { p - 1 } else { 0 };
                let cfg = config(op, dtype, redop, root);
                if dtype == DType::Bool && redop == ReduceOp::Avg {
                    let err = bench::run(rt, &cfg, &mut std::io::sink()).unwrap_err();
                    assert!(
                        err.to_string().contains("avg is not defined for bool"),
                        "{err}"
                    );
                    continue;
                }
                let report = bench::run(rt, &cfg, &mut std::io::sink()).unwrap();
                assert_eq!(
                    report.wrong_rows,
                    0,
                    "{} {dtype} {redop:?} np{p}: wrong results",
                    op.name()
                );
                if rt.rank() == 0 {
                    assert_eq!(report.rows.len(), 4, "sizes 8, 64, 512, 4096");
                    for r in &report.rows {
                        assert_eq!(r.out_of_place.wrong, Some(0));
                        assert_eq!(r.in_place.wrong, Some(0));
                        let factor = op.bus_factor(p);
                        assert!(
                            (r.out_of_place.busbw - r.out_of_place.algbw * factor).abs()
                                <= 1e-12 * r.out_of_place.algbw.max(1.0)
                        );
                        let per_iter = r.per_iter.as_ref().expect("--stats");
                        for col in per_iter {
                            assert_eq!(col.times_us.len(), 2, "-n 2");
                            assert_eq!(col.per_process_us.len(), p);
                        }
                    }
                }
                runs += 1;
            }
        }
    }
    // 4 reducing entries (reduce_scatter_v among them) × 15 dtypes × 5
    // operators but bool's avg, 9 others × 15 dtypes, broadcast_object on
    // bytes.
    assert_eq!(runs, 4 * (15 * 5 - 1) + 9 * 15 + 1);
}
