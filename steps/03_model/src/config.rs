//! The text model's hyper-parameters, read from `config.json`. Nothing about E2B is hard-coded: other
//! Gemma 4 sizes (more layers, more KV heads) load through the same code.
use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use crate::error::{invalid, Error, Result};

#[derive(Debug, Clone, Deserialize)]
pub struct Rope {
    pub rope_type: String,
    pub rope_theta: f64,
    #[serde(default = "one")]
    pub partial_rotary_factor: f64,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Clone, Deserialize)]
pub struct TextConfig {
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    /// Head size of the sliding-window layers.
    pub head_dim: i64,
    /// Head size of the full-attention layers. Transformers defaults it to 512 when absent; so do we.
    #[serde(default)]
    pub global_head_dim: Option<i64>,
    #[serde(default)]
    pub num_global_key_value_heads: Option<i64>,
    pub hidden_size_per_layer_input: i64,
    pub vocab_size: i64,
    pub vocab_size_per_layer_input: i64,
    #[serde(default)]
    pub num_kv_shared_layers: i64,
    #[serde(default)]
    pub use_double_wide_mlp: bool,
    #[serde(default)]
    pub attention_k_eq_v: bool,
    pub sliding_window: i64,
    pub max_position_embeddings: i64,
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub final_logit_softcapping: Option<f64>,
    pub hidden_activation: String,
    pub layer_types: Vec<String>,
    pub rope_parameters: HashMap<String, Rope>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attention {
    Sliding,
    Full,
}

impl TextConfig {
    /// Reads `config.json`: a `Gemma4ForCausalLM` config, or the multimodal layout with a `text_config`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::not_found(path, e.to_string()))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| invalid!("{}: not valid JSON: {e}", path.display()))?;
        let text_config = json.get("text_config").unwrap_or(&json).clone();
        let cfg: TextConfig = serde_json::from_value(text_config)
            .map_err(|e| invalid!("{}: not a Gemma 4 text config: {e}", path.display()))?;
        cfg.check().map_err(|e| invalid!("{}: {e}", path.display()))?;
        Ok(cfg)
    }

    fn check(&self) -> std::result::Result<(), String> {
        let positive = [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("sliding_window", self.sliding_window),
        ];
        if let Some((name, v)) = positive.iter().find(|(_, v)| *v <= 0) {
            return Err(format!("{name} must be positive, got {v}"));
        }
        if self.layer_types.len() as i64 != self.num_hidden_layers {
            return Err(format!("{} layer_types for {} layers", self.layer_types.len(), self.num_hidden_layers));
        }
        if let Some(t) =
            self.layer_types.iter().find(|t| !["sliding_attention", "full_attention"].contains(&t.as_str()))
        {
            return Err(format!("unknown layer type {t:?}"));
        }
        for t in ["sliding_attention", "full_attention"] {
            if !self.rope_parameters.contains_key(t) {
                return Err(format!("rope_parameters has no {t:?} entry"));
            }
        }
        if self.hidden_activation != "gelu_pytorch_tanh" {
            return Err(format!("hidden_activation {:?} is not gelu_pytorch_tanh", self.hidden_activation));
        }
        if self.attention_k_eq_v {
            return Err("attention_k_eq_v = true (values shared with keys) is not implemented".into());
        }
        if !(0..self.num_hidden_layers).contains(&self.num_kv_shared_layers) {
            return Err(format!("num_kv_shared_layers {} out of range", self.num_kv_shared_layers));
        }
        if self.num_kv_shared_layers > 0 {
            // a KV-shared layer borrows the cache of the last earlier layer of its type: one must exist
            for t in &self.layer_types[self.first_shared() as usize..] {
                if !self.layer_types[..self.first_shared() as usize].contains(t) {
                    return Err(format!("a KV-shared {t} layer has no earlier {t} layer to share with"));
                }
            }
        }
        Ok(())
    }

    pub fn attention(&self, layer: i64) -> Attention {
        match self.layer_types[layer as usize].as_str() {
            "full_attention" => Attention::Full,
            _ => Attention::Sliding,
        }
    }

    pub fn rope(&self, kind: Attention) -> &Rope {
        &self.rope_parameters[match kind {
            Attention::Full => "full_attention",
            Attention::Sliding => "sliding_attention",
        }]
    }

    pub fn head_dim(&self, kind: Attention) -> i64 {
        match kind {
            Attention::Full => self.global_head_dim.unwrap_or(512),
            Attention::Sliding => self.head_dim,
        }
    }

    pub fn kv_heads(&self, kind: Attention) -> i64 {
        match kind {
            Attention::Full => self.num_global_key_value_heads.unwrap_or(self.num_key_value_heads),
            Attention::Sliding => self.num_key_value_heads,
        }
    }

    /// The first layer that reuses another layer's keys and values instead of computing its own.
    pub fn first_shared(&self) -> i64 {
        self.num_hidden_layers - self.num_kv_shared_layers
    }

    /// Whose keys and values layer `i` attends over: its own, or (KV-shared layers) those of the last
    /// non-shared layer of the same attention type.
    pub fn kv_source(&self, i: i64) -> i64 {
        let first = self.first_shared();
        if i < first {
            return i;
        }
        (0..first).rev().find(|&j| self.attention(j) == self.attention(i)).expect("checked in check()")
    }

    pub fn intermediate(&self, i: i64) -> i64 {
        let wide = self.use_double_wide_mlp && i >= self.first_shared();
        self.intermediate_size * if wide { 2 } else { 1 }
    }
}

// --8<-- [start:layout]
/// What the caches look like for a context of `ctx` tokens:
/// (full-attention rings, sliding rings, KV-shared layers, sliding ring length).
/// A sliding ring holds `window + chunk` slots with `chunk = window`, so that a prompt chunk of `window`
/// new tokens still sees the `window` tokens before it.
pub fn layout(cfg: &TextConfig) -> (i64, i64, i64, i64) {
    let owners = 0..cfg.first_shared();
    let full = owners.clone().filter(|&i| cfg.attention(i) == Attention::Full).count() as i64;
    let sliding = owners.count() as i64 - full;
    (full, sliding, cfg.num_kv_shared_layers, 2 * cfg.sliding_window)
}
// --8<-- [end:layout]
