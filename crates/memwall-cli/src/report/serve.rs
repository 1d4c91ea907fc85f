//! `memwall serve`: KV-cache capacity of a vLLM deployment, following vLLM's own accounting.

use super::table::{md_text, Align, Table};
use super::text::Entries;
use super::{ModelInfo, Report};
use crate::args::ServeSettings;
use anyhow::{Context, Result};
use memwall_core::serve::{self, Fragmentation, ServeConfig, ServePlan};
use memwall_core::Bytes;
use serde::Serialize;
use std::io::{self, Write};

/// `memwall serve` result.
#[derive(Debug, Serialize)]
pub struct ServeReport {
    /// The model.
    pub model: ModelInfo,
    /// GPU id.
    pub gpu: String,
    /// Whose behaviour is simulated (`vllm`).
    pub runtime_profile: &'static str,
    /// The deployment as resolved (defaults and estimates filled in).
    pub config: ServeConfig,
    /// Where the weight bytes come from (`--weights`, `--quantization`, the checkpoint's
    /// headers, its quantization_config, or the checkpoint dtype).
    pub weights_from: String,
    /// Which inputs are memwall's estimates (vLLM measures them at start-up).
    pub estimated_inputs: Vec<&'static str>,
    /// vLLM's KV capacity.
    #[serde(flatten)]
    pub plan: ServePlan,
    /// vLLM's logged maximum concurrency by request length (tokens).
    pub max_concurrency: Entries<String, f64>,
    /// Contiguous versus paged waste by request length.
    pub fragmentation: Vec<Fragmentation>,
    /// The `vllm serve` command line of this deployment (with a max-model-len that fits).
    pub vllm_serve_command: String,
}

/// Plans the deployment of `s`.
pub fn build(s: &ServeSettings) -> Result<ServeReport> {
    let resolved =
        serve::resolve(&s.model.desc, s.gpu, &s.request).context("cannot plan this deployment")?;
    let cfg = resolved.config;
    let plan = serve::plan(&s.model.desc, &cfg).context("cannot plan this deployment")?;
    let mut conc: Vec<(String, f64)> = Vec::new();
    let mut frag = Vec::new();
    // pages hold the block size vLLM aligned to the state page (hybrids)
    let frag_cfg = ServeConfig {
        block_size: plan
            .state_cache
            .as_ref()
            .map_or(cfg.block_size, |s| s.block_size),
        ..cfg.clone()
    };
    for &n in &s.request_lengths {
        let key = n.to_string();
        let c = plan.max_concurrency(&cfg, n);
        // a length asked twice is one entry of the object
        match conc.iter_mut().find(|(k, _)| *k == key) {
            Some(e) => e.1 = c,
            None => conc.push((key, c)),
        }
        frag.push(serve::fragmentation(&frag_cfg, n));
    }
    let max_len = if plan.fits_max_model_len {
        cfg.max_model_len
    } else {
        plan.max_model_len_that_fits
    };
    // Nothing fits (not one KV block after weights, activations and graphs): vLLM would refuse
    // to start at any length, so no launch line is printed, only why (a `--max-model-len 0`
    // line would be a command that cannot run).
    let cmd = if max_len == 0 {
        format!(
            "# no `vllm serve` command: not one KV-cache block fits on a rank (weights/rank {} of \
             the {} requested); raise --tp, --gpu-memory-utilization or quantize the weights",
            Bytes(cfg.weights_bytes_per_rank),
            Bytes(plan.requested_memory_bytes)
        )
    } else {
        launch_command(s, &cfg, max_len)
    };
    Ok(ServeReport {
        model: ModelInfo::new(&s.model, 0),
        gpu: s.gpu.id.clone(),
        runtime_profile: "vllm",
        config: cfg,
        weights_from: s.weights_from.clone(),
        estimated_inputs: resolved.estimated_inputs,
        plan,
        max_concurrency: Entries(conc),
        fragmentation: frag,
        vllm_serve_command: cmd,
    })
}

/// The `vllm serve` line of a deployment that fits at `max_len` tokens.
fn launch_command(s: &ServeSettings, cfg: &ServeConfig, max_len: u64) -> String {
    let mut cmd = format!(
        "vllm serve {} --tensor-parallel-size {} --gpu-memory-utilization {} --max-model-len {max_len}",
        s.model.hf_repo.clone().unwrap_or_else(|| s.model.label.clone()),
        cfg.tp,
        cfg.gpu_memory_utilization,
    );
    if cfg.kv_dtype_bytes == 1 {
        cmd.push_str(" --kv-cache-dtype fp8");
    }
    if let Some(q) = &s.vllm_quantization {
        cmd.push_str(&format!(" --quantization {q}"));
    }
    if s.request.enforce_eager {
        cmd.push_str(" --enforce-eager");
    }
    if cfg.block_size != 16 {
        cmd.push_str(&format!(" --block-size {}", cfg.block_size));
    }
    match cfg.enable_prefix_caching {
        Some(true) => cmd.push_str(" --enable-prefix-caching"),
        Some(false) => cmd.push_str(" --no-enable-prefix-caching"),
        None => {}
    }
    cmd
}

impl ServeReport {
    fn memory_line(&self) -> String {
        let (cfg, p) = (&self.config, &self.plan);
        format!(
            "requested {} × {} = {}; weights/rank {}; activations {}; non-torch {}; CUDA graphs {}",
            Bytes(cfg.gpu_memory_bytes),
            cfg.gpu_memory_utilization,
            Bytes(p.requested_memory_bytes),
            Bytes(cfg.weights_bytes_per_rank),
            Bytes(cfg.activation_peak_bytes),
            Bytes(cfg.non_torch_bytes),
            Bytes(cfg.cuda_graph_bytes)
        )
    }

    fn kv_line(&self) -> String {
        let p = &self.plan;
        format!(
            "{} available → {} blocks of {} tokens ({} per block, {} KV heads/rank, {} group(s)) = {} tokens",
            Bytes(p.available_kv_bytes),
            p.num_gpu_blocks,
            p.state_cache
                .as_ref()
                .map_or(self.config.block_size, |s| s.block_size),
            Bytes(p.bytes_per_block),
            p.num_kv_heads_per_rank,
            p.groups.len(),
            p.kv_tokens
        )
    }

    fn state_line(&self) -> Option<String> {
        let (cfg, s) = (&self.config, self.plan.state_cache.as_ref()?);
        let state_groups = self
            .plan
            .groups
            .iter()
            .filter(|g| g.kind == serve::STATE_KIND)
            .count();
        let page = self.plan.groups.first().map_or(0, |g| g.page_size_bytes);
        let mut line = format!(
            "prefix caching {} → mamba_cache_mode {}: one state of {} per layer",
            if s.prefix_caching { "on" } else { "off" },
            s.mamba_cache_mode,
            Bytes(s.state_page_bytes),
        );
        if page != s.state_page_bytes {
            line.push_str(&format!(
                " padded to the attention page of {} (block size {} → {} tokens)",
                Bytes(page),
                cfg.block_size,
                s.block_size
            ));
        }
        line.push_str(&format!(
            "; each request holds {} block(s) in each of {} state group(s)",
            s.state_blocks_per_request, state_groups
        ));
        Some(line)
    }

    fn max_len_line(&self) -> String {
        let (cfg, p) = (&self.config, &self.plan);
        if p.fits_max_model_len {
            format!(
                "max-model-len {} fits (largest that fits: {})",
                cfg.max_model_len, p.max_model_len_that_fits
            )
        } else {
            format!(
                "max-model-len {} does NOT fit: vLLM would refuse to start; the largest that fits is {}",
                cfg.max_model_len, p.max_model_len_that_fits
            )
        }
    }

    fn heading(&self) -> String {
        format!(
            "{} on {} × {} (tp {}) · runtime profile vllm (vLLM 0.33 accounting)",
            self.model.label, self.gpu, self.config.tp, self.config.tp
        )
    }
}

impl Report for ServeReport {
    fn command(&self) -> &'static str {
        "serve"
    }

    fn write_table(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(w, "memwall serve · {}", self.heading())?;
        writeln!(w, "  model from: {}", self.model.origin)?;
        writeln!(w, "  weights from: {}", self.weights_from)?;
        writeln!(w, "  {}", self.memory_line())?;
        if !self.estimated_inputs.is_empty() {
            writeln!(
                w,
                "  (estimated by memwall, measured by vLLM at start-up: {})",
                self.estimated_inputs.join(", ")
            )?;
        }
        writeln!(w, "KV cache: {}", self.kv_line())?;
        if let Some(l) = self.state_line() {
            writeln!(w, "  states: {l}")?;
        }
        for (n, c) in &self.max_concurrency.0 {
            writeln!(w, "  max concurrency at {n:>6} tokens/request: {c:.2}")?;
        }
        writeln!(w, "{}", self.max_len_line())?;
        for f in &self.fragmentation {
            writeln!(
                w,
                "  {:>6}-token request: contiguous pre-allocation wastes {:.0}%, paged {:.1}%",
                f.request_tokens,
                f.contiguous_waste * 100.0,
                f.paged_waste * 100.0
            )?;
        }
        writeln!(w, "{}", self.vllm_serve_command)
    }

    fn write_markdown(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(w, "# memwall serve · {}", md_text(&self.heading()))?;
        writeln!(w)?;
        writeln!(w, "Model from: {}  ", md_text(&self.model.origin))?;
        writeln!(w, "Weights from: {}", md_text(&self.weights_from))?;
        writeln!(w)?;
        writeln!(w, "{}.", md_text(&self.memory_line()))?;
        if !self.estimated_inputs.is_empty() {
            writeln!(
                w,
                "Estimated by memwall, measured by vLLM at start-up: {}.",
                self.estimated_inputs
                    .iter()
                    .map(|e| format!("`{e}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )?;
        }
        writeln!(w)?;
        writeln!(w, "**KV cache**: {}.", md_text(&self.kv_line()))?;
        if let Some(l) = self.state_line() {
            writeln!(w)?;
            writeln!(w, "**States**: {}.", md_text(&l))?;
        }
        writeln!(w)?;
        writeln!(w, "{}.", md_text(&self.max_len_line()))?;
        writeln!(w)?;
        let mut t = Table::new(&[
            ("request tokens", Align::Right),
            ("max concurrency", Align::Right),
            ("contiguous waste", Align::Right),
            ("paged waste", Align::Right),
        ]);
        for f in &self.fragmentation {
            let c = self.concurrency_at(f.request_tokens);
            t.push(vec![
                f.request_tokens.to_string(),
                format!("{c:.2}"),
                format!("{:.0}%", f.contiguous_waste * 100.0),
                format!("{:.1}%", f.paged_waste * 100.0),
            ]);
        }
        t.write_markdown(w)?;
        writeln!(w)?;
        writeln!(w, "```sh")?;
        writeln!(w, "{}", self.vllm_serve_command)?;
        writeln!(w, "```")
    }

    fn csv_table(&self) -> Option<Table> {
        let mut t = Table::new(&[
            ("request_tokens", Align::Right),
            ("max_concurrency", Align::Right),
            ("contiguous_waste", Align::Right),
            ("paged_waste", Align::Right),
        ]);
        for f in &self.fragmentation {
            t.push(vec![
                f.request_tokens.to_string(),
                self.concurrency_at(f.request_tokens).to_string(),
                f.contiguous_waste.to_string(),
                f.paged_waste.to_string(),
            ]);
        }
        Some(t)
    }
}

impl ServeReport {
    /// The maximum concurrency of requests of `tokens` tokens.
    fn concurrency_at(&self, tokens: u64) -> f64 {
        let key = tokens.to_string();
        self.max_concurrency
            .0
            .iter()
            .find(|(k, _)| *k == key)
            .map_or(0.0, |(_, c)| *c)
    }
}

/// The `--emit vllm` files of the deployment `s` describes (the same resolution the report uses).
pub fn emit_files(
    s: &ServeSettings,
    kind: memwall_core::emit::EmitKind,
) -> Result<Vec<memwall_core::emit::EmittedFile>> {
    use memwall_core::emit::{emit_serve, Provenance, ServeLaunchSpec};
    let Some(kv) = s.vllm_kv else {
        return Err(crate::error::UserError::new(
            "`--emit vllm` writes --kv-cache-dtype auto or fp8*, not float16/bfloat16",
            "use --kv-cache-dtype auto for the model's own dtype",
        )
        .into());
    };
    let resolved =
        serve::resolve(&s.model.desc, s.gpu, &s.request).context("cannot plan this deployment")?;
    let plan =
        serve::plan(&s.model.desc, &resolved.config).context("cannot plan this deployment")?;
    if !plan.fits_max_model_len && plan.max_model_len_that_fits == 0 {
        return Err(crate::error::UserError::new(
            format!(
                "`--emit vllm`: nothing fits on a rank of {} (weights/rank {} of the {} \
                 requested leave no KV-cache block), so there is no config vLLM would start with",
                s.gpu.id,
                Bytes(resolved.config.weights_bytes_per_rank),
                Bytes(plan.requested_memory_bytes)
            ),
            "raise --tp, --gpu-memory-utilization or quantize the weights; \
             `memwall serve` without --emit shows the budget",
        )
        .into());
    }
    let mut cfg = resolved.config.clone();
    if !plan.fits_max_model_len {
        cfg.max_model_len = plan.max_model_len_that_fits;
    }
    let mut spec = ServeLaunchSpec::from_serve(
        crate::emit::model_id(&s.model),
        &cfg,
        kv,
        resolved.max_num_seqs,
        s.request.enforce_eager,
    )
    .with_provenance(Provenance {
        command: format!("memwall serve --model {} --gpu {}", s.model.label, s.gpu.id),
        estimate: format!(
            "{} KV blocks of {} tokens, max-model-len {}",
            plan.num_gpu_blocks, cfg.block_size, cfg.max_model_len
        ),
    });
    if let serve::ServeWeights::Format(w) = s.request.weights {
        spec = spec.with_weights(w);
    }
    emit_serve(kind, &spec).map_err(crate::emit::user_error)
}
