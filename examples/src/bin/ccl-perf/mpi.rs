//! `--backend mpi`: the same sweep through MPI (rsmpi's MPI_Allreduce,
//! MPI_Bcast, ...), run under `mpirun`, so ccl and MPI are measured by one
//! tool with one table. Float sum only. rsmpi has no `MPI_IN_PLACE`, so
//! the in-place columns are a second out-of-place measurement.

use super::exact::{self, value};
use super::table::{self, Mode};
use super::{halo_dirs, neighbour, Args, Coll};
use mpi::collective::SystemOperation;
use mpi::datatype::{Partition, PartitionMut};
use mpi::traits::*;
use std::time::Instant;

/// Runs the sweep; the process exit code.
pub fn run(a: &Args, coll: Coll) -> i32 {
    if a.dtype != "float" || a.op != "sum" || coll == Coll::ReduceScatterV {
        eprintln!("ccl-perf: --backend mpi measures float sum only, and no reduce_scatterv (rsmpi lacks it)");
        return 2;
    }
    let Some(universe) = mpi::initialize() else {
        eprintln!("ccl-perf: MPI was already initialised");
        return 1;
    };
    let world = universe.world();
    let (n, r) = (world.size() as usize, world.rank() as usize);
    let root = a.root.min(n - 1);
    let me = r == 0;
    if me {
        let (major, minor) = mpi::environment::version();
        println!(
            "# ccl-perf: {} on {n} ranks, float sum, {} .. {} bytes ×{}, {} iters, {} warmup, backend mpi (MPI {major}.{minor}: {})",
            coll.name(),
            a.min,
            a.max,
            a.factor,
            a.iters,
            a.warmup,
            mpi::environment::library_version().unwrap_or_default().lines().next().unwrap_or("").trim_end_matches(char::from(0))
        );
    }
    let elem = 4;
    let unit = elem * coll.blocks(n);
    let mut size = a.min.max(unit);
    let mut table = table::Table::new(me, coll.name(), n, false);
    while size <= a.max.max(unit) {
        let bytes = size / unit * unit;
        let count = bytes / unit;
        let (li, lo) = coll.lens((n, r, root), count);
        let input: Vec<f32> = (0..li).map(|i| value(r, i)).collect();
        let mut output = vec![0f32; lo];
        // (the varying calls' counts and displacements, made once per size)
        let counts = vec![count as mpi::Count; n];
        let displs: Vec<mpi::Count> = (0..n).map(|k| (k * count) as mpi::Count).collect();
        let call = |input: &[f32], output: &mut [f32]| match coll {
            Coll::AllReduce => world.all_reduce_into(input, output, SystemOperation::sum()),
            Coll::Broadcast => {
                if r == root {
                    output.copy_from_slice(input);
                }
                world.process_at_rank(root as i32).broadcast_into(output)
            }
            Coll::Reduce if r == root => {
                world.process_at_rank(root as i32).reduce_into_root(input, output, SystemOperation::sum())
            }
            Coll::Reduce => world.process_at_rank(root as i32).reduce_into(input, SystemOperation::sum()),
            Coll::AllGather => world.all_gather_into(input, output),
            Coll::ReduceScatter => world.reduce_scatter_block_into(input, output, SystemOperation::sum()),
            Coll::AllToAll => world.all_to_all_into(input, output),
            Coll::Gather if r == root => world.process_at_rank(root as i32).gather_into_root(input, output),
            Coll::Gather => world.process_at_rank(root as i32).gather_into(input),
            Coll::Scatter if r == root => world.process_at_rank(root as i32).scatter_into_root(input, output),
            Coll::Scatter => world.process_at_rank(root as i32).scatter_into(output),
            Coll::Scan => world.scan_into(input, output, SystemOperation::sum()),
            Coll::Exscan => world.exclusive_scan_into(input, output, SystemOperation::sum()),
            Coll::SendRecv => {
                let (to, from) = (neighbour(r, 1, n), neighbour(r, -1, n));
                let (to, from) = (world.process_at_rank(to as i32), world.process_at_rank(from as i32));
                mpi::point_to_point::send_receive_into(input, &to, output, &from);
            }
            Coll::Halo => halo(&world, input, output),
            v => varying(&world, v, (root, &counts, &displs), input, output),
        };
        let mut modes = Vec::new();
        for _ in 0..2 {
            call(&input, &mut output);
            let wrong = exact::wrong(coll, (n, r, root), count, &output);
            for _ in 0..a.warmup {
                call(&input, &mut output);
            }
            world.barrier();
            let t = Instant::now();
            for _ in 0..a.iters.max(1) {
                call(&input, &mut output);
            }
            let secs = t.elapsed().as_secs_f64() / a.iters.max(1) as f64;
            let mut worst = 0f64;
            world.all_reduce_into(&secs, &mut worst, SystemOperation::max());
            let mut wrong_all = 0u64;
            world.all_reduce_into(&wrong, &mut wrong_all, SystemOperation::sum());
            let algbw = bytes as f64 / worst / 1e9;
            modes.push(Mode {
                time_us: worst * 1e6,
                algbw,
                busbw: algbw * coll.busbw_factor(n),
                wrong: wrong_all,
                host_us: None,
            });
        }
        let rooted = if coll.rooted() { root as i64 } else { -1 };
        let redop = if coll.reduces() { "sum" } else { "none" };
        table.row(bytes, bytes / elem, "float", redop, rooted, &modes[0], &modes[1]);
        if a.factor < 2 {
            break;
        }
        size = size.saturating_mul(a.factor);
    }
    table.footer();
    let title = format!("ccl-perf --backend mpi: {} on {n} ranks (float)", coll.name());
    if let Err(code) = table.save(a.plot.as_deref(), a.json.as_deref(), &title, "MPI") {
        return code;
    }
    i32::from(table.wrong() > 0)
}

/// The halo as MPI programs post it: every receive and send at once
/// (MPI_Irecv, MPI_Isend, tagged by direction), then MPI_Waitall.
fn halo<C: Communicator>(world: &C, input: &[f32], output: &mut [f32]) {
    let (n, r) = (world.size() as usize, world.rank() as usize);
    let dirs = halo_dirs(n);
    let count = input.len() / dirs.len().max(1);
    mpi::request::scope(|scope| {
        let mut pending = Vec::with_capacity(2 * dirs.len());
        for ((k, &d), out) in dirs.iter().enumerate().zip(output.chunks_mut(count.max(1))) {
            let (to, from) = (neighbour(r, d, n) as i32, neighbour(r, -d, n) as i32);
            let tag = k as i32;
            pending.push(world.process_at_rank(from).immediate_receive_into_with_tag(scope, out, tag));
            let block = &input[k * count..(k + 1) * count];
            pending.push(world.process_at_rank(to).immediate_send_with_tag(scope, block, tag));
        }
        for p in pending {
            p.wait();
        }
    });
}

/// The varying calls (MPI_Allgatherv, MPI_Alltoallv, MPI_Gatherv,
/// MPI_Scatterv) on `counts` at `displs`.
fn varying<C: Communicator>(
    world: &C,
    coll: Coll,
    (root, counts, displs): (usize, &[mpi::Count], &[mpi::Count]),
    input: &[f32],
    output: &mut [f32],
) {
    let r = world.rank() as usize;
    let at = world.process_at_rank(root as i32);
    match coll {
        Coll::AllGatherV => world.all_gather_varcount_into(input, &mut PartitionMut::new(output, counts, displs)),
        Coll::AllToAllV => {
            let send = Partition::new(input, counts, displs);
            world.all_to_all_varcount_into(&send, &mut PartitionMut::new(output, counts, displs));
        }
        Coll::GatherV if r == root => {
            at.gather_varcount_into_root(input, &mut PartitionMut::new(output, counts, displs))
        }
        Coll::GatherV => at.gather_varcount_into(input),
        Coll::ScatterV if r == root => at.scatter_varcount_into_root(&Partition::new(input, counts, displs), output),
        Coll::ScatterV => at.scatter_varcount_into(output),
        // (refused in `run`; the others are not varying)
        _ => {}
    }
}
