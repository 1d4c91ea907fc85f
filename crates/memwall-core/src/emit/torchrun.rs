//! `torchrun`: the launch line for the job's processes (PyTorch 2.15
//! `torch/distributed/run.py`: `--nnodes`, `--nproc-per-node`, `--node-rank`,
//! `--rdzv-backend`, `--rdzv-endpoint`, `--standalone`).

use super::{
    hash_comment, header_lines, hf_script_notes, shell, EmitError, EmittedFile, LaunchSpec,
};

/// `torchrun …` for `spec`'s nodes and processes (without the script).
pub(super) fn command(spec: &LaunchSpec) -> String {
    let nodes = spec.num_nodes();
    let mut s = format!(
        "torchrun --nnodes {nodes} --nproc-per-node {}",
        spec.procs_per_node()
    );
    if nodes > 1 {
        s.push_str(&format!(
            " --node-rank {} --rdzv-backend c10d --rdzv-endpoint {}",
            shell::var("NODE_RANK", "0"),
            shell::var("RDZV_ENDPOINT", "localhost:29500")
        ));
    } else {
        s.push_str(" --standalone");
    }
    s
}

pub(super) fn emit(spec: &LaunchSpec) -> Result<Vec<EmittedFile>, EmitError> {
    let mut lines = header_lines(&spec.provenance, "torchrun (PyTorch 2.15)");
    lines.push(format!(
        "{} node(s) × {} process(es); run this on every node (NODE_RANK 0..{}).",
        spec.num_nodes(),
        spec.procs_per_node(),
        spec.num_nodes().saturating_sub(1)
    ));
    lines.push(String::new());
    if spec.is_megatron() {
        lines.push(
            "TRAIN_SCRIPT is Megatron-LM's pretrain_gpt.py with the arguments of --emit megatron."
                .to_string(),
        );
    } else {
        lines.extend(hf_script_notes(spec, false));
    }
    let mut sh = String::from("#!/usr/bin/env bash\n");
    sh.push_str(&hash_comment(&lines));
    sh.push_str("set -euo pipefail\n");
    sh.push_str(&format!(
        "exec {} {} \"$@\"\n",
        command(spec),
        shell::var("TRAIN_SCRIPT", "train.py")
    ));
    Ok(vec![EmittedFile::new("launch_torchrun.sh", sh)])
}
