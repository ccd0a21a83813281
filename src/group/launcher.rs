//! Cross-checks of the launcher's environment against what MPI reports.
//!
//! MPI is the source of truth for rank, size and locality; the launcher's
//! variables are only compared, so a broken launch is caught at start instead of
//! as a hang or a wrong result much later.

use crate::error::{Error, Result};

/// What MPI reports about this process.
#[derive(Clone, Copy, Debug)]
pub struct MpiView {
    /// World rank.
    pub rank: usize,
    /// World size.
    pub size: usize,
    /// Rank among the processes on this node.
    pub local_rank: usize,
    /// Number of processes on this node.
    pub local_size: usize,
}

/// (launcher, variable, field of [`MpiView`]) triples that are compared.
const CHECKS: &[(&str, &str, Field)] = &[
    ("Open MPI", "OMPI_COMM_WORLD_RANK", Field::Rank),
    ("Open MPI", "OMPI_COMM_WORLD_SIZE", Field::Size),
    ("Open MPI", "OMPI_COMM_WORLD_LOCAL_RANK", Field::LocalRank),
    ("Open MPI", "OMPI_COMM_WORLD_LOCAL_SIZE", Field::LocalSize),
    ("Slurm", "SLURM_PROCID", Field::Rank),
    ("Slurm", "SLURM_LOCALID", Field::LocalRank),
    ("MPICH/Hydra", "PMI_RANK", Field::Rank),
    ("MPICH/Hydra", "PMI_SIZE", Field::Size),
    ("MPICH/Hydra", "MPI_LOCALRANKID", Field::LocalRank),
    ("MPICH/Hydra", "MPI_LOCALNRANKS", Field::LocalSize),
    ("torchrun", "RANK", Field::Rank),
    ("torchrun", "WORLD_SIZE", Field::Size),
    ("torchrun", "LOCAL_RANK", Field::LocalRank),
    ("torchrun", "LOCAL_WORLD_SIZE", Field::LocalSize),
];

#[derive(Clone, Copy, Debug)]
enum Field {
    Rank,
    Size,
    LocalRank,
    LocalSize,
}

impl Field {
    fn get(self, v: &MpiView) -> usize {
        match self {
            Field::Rank => v.rank,
            Field::Size => v.size,
            Field::LocalRank => v.local_rank,
            Field::LocalSize => v.local_size,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Field::Rank => "world rank",
            Field::Size => "world size",
            Field::LocalRank => "local rank",
            Field::LocalSize => "local size",
        }
    }
}

/// Compares the launcher variables visible through `env` with MPI's view.
///
/// Returns warnings for disagreements, or an error for the disagreements
/// that are certain to break the job: Slurm, or an MPI launcher, started N
/// processes but each one is a world of 1 (the launcher's process manager
/// is not the one of the MPI library that loaded: `srun` without the right
/// `--mpi`, or one MPI's `mpirun` starting a program built against
/// another).
/// `allow_singleton`: [`Options::allow_singleton`](crate::Options::allow_singleton).
pub fn check(
    env: &dyn Fn(&str) -> Option<String>,
    view: &MpiView,
    allow_singleton: bool,
) -> Result<Vec<String>> {
    let number = |k: &str| env(k).and_then(|v| v.trim().parse::<usize>().ok());
    let fix = |n: usize| {
        format!(
            "Launch with `srun --mpi={}` (see `srun --mpi=list`), or run `mpirun -np {n}` inside the allocation",
            crate::mpi_abi::srun_mpi()
        )
    };
    let mut warnings = Vec::new();
    // srun started this process itself: its step's task count is the world.
    if let Some(n) = number("SLURM_STEP_NUM_TASKS") {
        if n != view.size && !allow_singleton {
            let how = if view.size == 1 {
                format!("the tasks started as {n} separate singletons, so srun's PMI does not match the MPI library")
            } else {
                "srun's task count and the MPI world disagree".to_string()
            };
            return Err(Error::Launch(format!(
                "SLURM_STEP_NUM_TASKS={n} but MPI reports a world of {}: {how}. {}; set RANKMESH_ALLOW_SINGLETON=1 if this is intended",
                view.size,
                fix(n)
            )));
        }
    } else if let Some(n) = number("SLURM_NTASKS") {
        // Inside an allocation without srun: mpirun may use fewer ranks on purpose,
        // but a lone process that is not under mpirun is a missing launcher.
        let under_mpirun = env("OMPI_COMM_WORLD_SIZE").is_some() || env("PMI_SIZE").is_some();
        if view.size == 1 && n > 1 && !under_mpirun && !allow_singleton {
            return Err(Error::Launch(format!(
                "SLURM_NTASKS={n} but MPI reports a world of 1: the tasks started as {n} separate singletons, or the program ran without a launcher. {}; set RANKMESH_ALLOW_SINGLETON=1 if a single process is intended",
                fix(n)
            )));
        }
        if n != view.size {
            warnings.push(format!(
                "Slurm: SLURM_NTASKS={n} disagrees with the MPI world size {}",
                view.size
            ));
        }
    }
    // One MPI's launcher starting a program of another MPI: every process
    // initialises as a world of its own and would run the job N times.
    for (launcher, var) in [
        ("Open MPI's mpirun", "OMPI_COMM_WORLD_SIZE"),
        ("a hydra launcher (MPICH, Intel MPI)", "PMI_SIZE"),
    ] {
        match number(var) {
            Some(n) if n > 1 && view.size == 1 && !allow_singleton => {
                return Err(Error::Launch(format!(
                    "{launcher} started {n} processes ({var}={n}) but MPI reports a world of 1: each started as a singleton, so the launcher is not the one of the MPI library that loaded ({}). Start the program with the launcher of the MPI it was built against; set RANKMESH_ALLOW_SINGLETON=1 if this is intended",
                    crate::mpi_abi::library_version()
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ")
                )))
            }
            _ => {}
        }
    }
    for (launcher, var, field) in CHECKS {
        let Some(raw) = env(var) else { continue };
        let mpi = field.get(view);
        match raw.trim().parse::<usize>() {
            Ok(v) if v == mpi => {}
            Ok(v) => warnings.push(format!(
                "{launcher}: {var}={v} disagrees with the MPI {} {mpi}",
                field.name()
            )),
            Err(_) => warnings.push(format!("{launcher}: {var}={raw:?} is not a number")),
        }
    }
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let owned: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| owned.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.clone())
    }

    const VIEW: MpiView = MpiView {
        rank: 1,
        size: 4,
        local_rank: 1,
        local_size: 2,
    };

    #[test]
    fn agreeing_launchers_give_no_warning() {
        let env = env_of(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("SLURM_NTASKS", "4"),
            ("LOCAL_RANK", "1"),
        ]);
        assert!(check(&env, &VIEW, false).unwrap().is_empty());
    }

    #[test]
    fn disagreement_is_a_warning_naming_both_values() {
        let env = env_of(&[("LOCAL_RANK", "3"), ("PMI_SIZE", "x")]);
        let w = check(&env, &VIEW, false).unwrap();
        assert_eq!(w.len(), 2);
        assert!(w[0].contains("PMI_SIZE=\"x\" is not a number"), "{w:?}");
        assert!(
            w[1].contains("torchrun: LOCAL_RANK=3 disagrees with the MPI local rank 1"),
            "{w:?}"
        );
    }

    #[test]
    fn slurm_singletons_are_an_error_with_the_fix() {
        let single = MpiView {
            rank: 0,
            size: 1,
            local_rank: 0,
            local_size: 1,
        };
        let e = check(&env_of(&[("SLURM_NTASKS", "4")]), &single, false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("SLURM_NTASKS=4 but MPI reports a world of 1"),
            "{e}"
        );
        let srun = format!("srun --mpi={}", crate::mpi_abi::srun_mpi());
        assert!(e.contains(&srun), "{e}");
        let allocation = env_of(&[("SLURM_NTASKS", "4")]);
        assert_eq!(check(&allocation, &single, true).unwrap().len(), 1);
    }

    #[test]
    fn another_mpis_launcher_is_an_error() {
        let single = MpiView {
            rank: 0,
            size: 1,
            local_rank: 0,
            local_size: 1,
        };
        for (var, who) in [
            (
                "OMPI_COMM_WORLD_SIZE",
                "Open MPI's mpirun started 4 processes",
            ),
            (
                "PMI_SIZE",
                "a hydra launcher (MPICH, Intel MPI) started 4 processes",
            ),
        ] {
            let e = check(&env_of(&[(var, "4")]), &single, false)
                .unwrap_err()
                .to_string();
            assert!(e.contains(who), "{e}");
            assert!(e.contains("each started as a singleton"), "{e}");
            assert!(check(&env_of(&[(var, "4")]), &single, true).is_ok());
            assert!(check(&env_of(&[(var, "1")]), &single, false).is_ok());
        }
        // A real world of 4 with the launcher's 4 is fine.
        assert!(check(&env_of(&[("PMI_SIZE", "4")]), &VIEW, false).is_ok());
    }

    #[test]
    fn srun_step_size_must_match_the_world() {
        let single = MpiView {
            rank: 0,
            size: 1,
            local_rank: 0,
            local_size: 1,
        };
        let e = check(&env_of(&[("SLURM_STEP_NUM_TASKS", "2")]), &single, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("SLURM_STEP_NUM_TASKS=2 but MPI reports a world of 1: the tasks started as 2 separate singletons"), "{e}");
        let e = check(
            &env_of(&[("SLURM_STEP_NUM_TASKS", "8"), ("SLURM_NTASKS", "8")]),
            &VIEW,
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("SLURM_STEP_NUM_TASKS=8 but MPI reports a world of 4: srun's task count and the MPI world disagree"), "{e}");
        assert!(e.contains("mpirun -np 8"), "{e}");
        assert!(
            check(&env_of(&[("SLURM_STEP_NUM_TASKS", "4")]), &VIEW, false)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn mpirun_inside_a_larger_allocation_only_warns() {
        let env = env_of(&[("SLURM_NTASKS", "8"), ("OMPI_COMM_WORLD_SIZE", "4")]);
        let w = check(&env, &VIEW, false).unwrap();
        assert_eq!(
            w,
            vec!["Slurm: SLURM_NTASKS=8 disagrees with the MPI world size 4".to_string()]
        );
        let single = MpiView {
            rank: 0,
            size: 1,
            local_rank: 0,
            local_size: 1,
        };
        let env = env_of(&[("SLURM_NTASKS", "8"), ("OMPI_COMM_WORLD_SIZE", "1")]);
        assert!(
            check(&env, &single, false).is_ok(),
            "mpirun -np 1 in an allocation is intended"
        );
    }
}
