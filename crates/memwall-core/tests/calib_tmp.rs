// TEMPORARY calibration against tests/truth fixtures for llama-like configs (removed once memwall-formats lands).
use memwall_core::memory::{simulate_train, Kernels};
use memwall_core::model::*;
use memwall_core::workload::*;
use serde_json::Value;

fn desc(cfg: &Value) -> Option<ModelDesc> {
    let mt = cfg["model_type"].as_str()?;
    if !["llama", "mistral", "qwen2"].contains(&mt) {
        return None;
    }
    let h = cfg["hidden_size"].as_u64()?;
    let nh = cfg["num_attention_heads"].as_u64()?;
    let kv = cfg["num_key_value_heads"].as_u64().unwrap_or(nh);
    let hd = cfg["head_dim"].as_u64().unwrap_or(h / nh);
    let i = cfg["intermediate_size"].as_u64()?;
    let v = cfg["vocab_size"].as_u64()?;
    let l = cfg["num_hidden_layers"].as_u64()?;
    let tied = cfg["tie_word_embeddings"].as_bool().unwrap_or(false);
    let norm = Norm {
        kind: NormKind::RmsNorm,
        dim: h,
        bias: false,
    };
    let layer = LayerSpec {
        attn_norm: Some(norm),
        attn_post_norm: None,
        mlp_norm: Some(norm),
        mlp_post_norm: None,
        residual: Residual::Sequential,
        attention: Attention {
            kind: AttentionKind::Standard {
                num_heads: nh,
                num_kv_heads: kv,
                head_dim: hd,
            },
            qkv_bias: mt == "qwen2",
            o_bias: false,
            fused_qkv: false,
            qk_norm: None,
            rotary_dim: Some(hd),
            sliding_window: None,
            logit_softcap: None,
        },
        mlp: Mlp::Dense(DenseMlp {
            intermediate: i,
            gated: true,
            fused_gate_up: false,
            bias: false,
            act: Activation::Silu,
        }),
    };
    Some(ModelDesc {
        model_type: mt.into(),
        hidden_size: h,
        max_position_embeddings: 4096,
        embeddings: Embeddings {
            vocab_size: v,
            dim: h,
            learned_positions: None,
            projections: false,
            scaled: false,
            norm: None,
        },
        layers: vec![layer; l as usize],
        head: Head {
            final_norm: Some(norm),
            tied,
            bias: false,
            logit_softcap: None,
        },
        dropout: Dropout::default(),
        linear_names: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
        .iter()
        .zip([
            LinearRole::Q,
            LinearRole::K,
            LinearRole::V,
            LinearRole::O,
            LinearRole::Gate,
            LinearRole::Up,
            LinearRole::Down,
        ])
        .map(|(n, r)| (r, n.to_string()))
        .collect(),
    })
}

#[test]
fn calib() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let text = std::fs::read_to_string(format!("{root}/tests/truth/train.jsonl")).unwrap();
    for line in text.lines() {
        let c: Value = serde_json::from_str(line).unwrap();
        let cfg: Value = serde_json::from_str(
            &std::fs::read_to_string(format!("{root}/{}", c["config"].as_str().unwrap())).unwrap(),
        )
        .unwrap();
        let Some(m) = desc(&cfg) else { continue };
        let prec = Precision::ALL
            .iter()
            .find(|(_, n)| *n == c["precision"].as_str().unwrap())
            .unwrap()
            .0;
        let opt = Optimizer::ALL
            .iter()
            .find(|(_, n)| *n == c["optimizer"].as_str().unwrap())
            .map(|x| x.0);
        let Some(opt) = opt else { continue };
        let lora = c["lora"].as_object().map(|l| Lora {
            rank: l["rank"].as_u64().unwrap(),
            targets: l["targets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap().to_string())
                .collect(),
            qlora: false,
        });
        let w = TrainWorkload {
            batch: c["batch"].as_u64().unwrap(),
            seq: c["seq"].as_u64().unwrap(),
            precision: prec,
            optimizer: opt,
            checkpointing: c["checkpointing"].as_bool().unwrap(),
            attention: if c["attention"] == "eager" {
                AttentionImpl::Eager
            } else {
                AttentionImpl::Sdpa
            },
            lora,
            grad_accum: c["grad_accum"].as_u64().unwrap(),
            dropout: c["dropout"] == "config",
        };
        let e = simulate_train(&m, &w, Kernels::Cpu).unwrap();
        let meas = c["measured"]["peak_bytes"].as_u64().unwrap() as f64;
        let err = (e.peak_bytes as f64 - meas) / meas * 100.0;
        println!(
            "{:>7.2}% {:<40} est {:>14} meas {:>14} {:?}/{} params {} vs {}",
            err,
            c["id"].as_str().unwrap(),
            e.peak_bytes,
            meas as u64,
            e.phase,
            c["measured"]["phase"],
            e.params_total,
            c["measured"]["params_total"]
        );
        println!(
            "      est {:?}\n      meas {}",
            e.at_peak.iter().filter(|x| x.1 > 0).collect::<Vec<_>>(),
            c["measured"]["at_peak"]
        );
    }
}
