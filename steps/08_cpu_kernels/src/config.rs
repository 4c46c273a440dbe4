//! `config.json`, read once per checkpoint: the text model's hyper-parameters and how its weights are
//! quantized. Nothing about E2B is hard-coded: other Gemma 4 sizes (more layers, more KV heads) load through
//! the same code.
use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use crate::error::{invalid, Error, Result};

/// A checkpoint's `config.json`.
pub struct Config {
    pub text: TextConfig,
    /// Columns per scale of the W4A16 weights; None when nothing is quantized.
    pub group_size: Option<i64>,
}

impl Config {
    /// Reads `config.json`: a `Gemma4ForCausalLM` config, or the multimodal layout with a `text_config`.
    pub fn from_file(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::reading(path, e))?;
        Config::parse(&text, path)
    }

    /// `path` only names the file in error messages.
    fn parse(text: &str, path: &Path) -> Result<Config> {
        let json: serde_json::Value =
            serde_json::from_str(text).map_err(|e| invalid!("{}: not valid JSON: {e}", path.display()))?;
        let text_config = json.get("text_config").unwrap_or(&json);
        let cfg = TextConfig::deserialize(text_config)
            .map_err(|e| invalid!("{}: not a Gemma 4 text config: {e}", path.display()))?;
        cfg.check().map_err(|e| invalid!("{}: {e}", path.display()))?;
        let group_size = match json.get("quantization_config") {
            Some(q) => group_size(q, path)?,
            None => None,
        };
        Ok(Config { text: cfg, group_size })
    }
}

/// The group size of a W4A16 `quantization_config`; any other quantization is refused by name.
fn group_size(q: &serde_json::Value, path: &Path) -> Result<Option<i64>> {
    let unsupported = |what: String| Error::Unsupported(format!("{}: quantization_config {what}", path.display()));
    let method = q["quant_method"].as_str().unwrap_or("");
    if method != "compressed-tensors" {
        return Err(unsupported(format!("quant_method {method:?}: only compressed-tensors is implemented")));
    }
    let format = q["format"].as_str().unwrap_or("");
    if format != "pack-quantized" {
        return Err(unsupported(format!("format {format:?}: only pack-quantized is implemented")));
    }
    let groups = q["config_groups"].as_object().ok_or_else(|| unsupported("has no config_groups".into()))?;
    let mut group_size = None;
    for (name, group) in groups {
        let w = &group["weights"];
        let (bits, sym, strategy) = (w["num_bits"].as_i64(), w["symmetric"].as_bool(), w["strategy"].as_str());
        if bits != Some(4) || w["type"].as_str() != Some("int") {
            return Err(unsupported(format!(
                "{name}: num_bits {bits:?} type {}: only 4-bit int is implemented",
                w["type"]
            )));
        }
        if sym != Some(true) || strategy != Some("group") {
            return Err(unsupported(format!(
                "{name}: symmetric {sym:?} strategy {strategy:?}: only symmetric group scales are implemented"
            )));
        }
        let size = w["group_size"]
            .as_i64()
            .filter(|&g| g > 0)
            .ok_or_else(|| invalid!("{}: {name} has no positive group_size", path.display()))?;
        if group_size.is_some_and(|g| g != size) {
            return Err(unsupported(format!("mixes group sizes {group_size:?} and {size}")));
        }
        group_size = Some(size);
    }
    Ok(group_size)
}

#[derive(Debug, Clone, Deserialize)]
pub struct Rope {
    pub rope_type: String,
    pub rope_theta: f64,
    #[serde(default = "one")]
    pub partial_rotary_factor: f64,
    /// Proportional RoPE divides every frequency by it, as Transformers does (default 1).
    #[serde(default = "one")]
    pub factor: f64,
}

fn one() -> f64 {
    1.0
}

fn yes() -> bool {
    true
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
    /// Tied: the output head is the embedding table, even when a checkpoint also ships an `lm_head`.
    #[serde(default = "yes")]
    pub tie_word_embeddings: bool,
    pub layer_types: Vec<String>,
    pub rope_parameters: HashMap<String, Rope>,
}

/// The two kinds of attention layer: a sliding window of recent tokens, or the full context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKind {
    Sliding,
    Full,
}

/// One of something for each attention kind (caches, rotary frequencies, masks).
pub struct ByKind<T> {
    pub sliding: T,
    pub full: T,
}

impl<T> ByKind<T> {
    pub fn try_new(mut make: impl FnMut(AttentionKind) -> Result<T>) -> Result<ByKind<T>> {
        Ok(ByKind { sliding: make(AttentionKind::Sliding)?, full: make(AttentionKind::Full)? })
    }

    pub fn get(&self, kind: AttentionKind) -> &T {
        match kind {
            AttentionKind::Sliding => &self.sliding,
            AttentionKind::Full => &self.full,
        }
    }

    pub fn get_mut(&mut self, kind: AttentionKind) -> &mut T {
        match kind {
            AttentionKind::Sliding => &mut self.sliding,
            AttentionKind::Full => &mut self.full,
        }
    }
}

/// The largest size a config may give (2^24; E2B's largest, its vocabulary, is 2^18).
const MOST: i64 = 1 << 24;

impl TextConfig {
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
        // Sizes are multiplied together (a cache's slots × heads × head size, a ring's 2 × window): a garbled
        // value past any model's would wrap an i64 product silently instead of failing here.
        let sizes = [
            ("intermediate_size", self.intermediate_size),
            ("global_head_dim", self.global_head_dim.unwrap_or(0)),
            ("hidden_size_per_layer_input", self.hidden_size_per_layer_input),
            ("vocab_size_per_layer_input", self.vocab_size_per_layer_input),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        if let Some((name, v)) = positive.iter().chain(&sizes).find(|(_, v)| !(0..=MOST).contains(v)) {
            return Err(format!("{name} = {v}: need 0 <= {name} <= {MOST}"));
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
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
            let Some(rope) = self.rope_parameters.get(t) else {
                return Err(format!("rope_parameters has no {t:?} entry"));
            };
            // the two RoPE kinds Gemma 4 uses (Rotary::new); another would run as "default", silently wrong
            if !["default", "proportional"].contains(&rope.rope_type.as_str()) {
                return Err(format!(
                    "rope_parameters[{t:?}]: rope_type {:?} is not default or proportional",
                    rope.rope_type
                ));
            }
            if !(rope.partial_rotary_factor > 0.0 && rope.partial_rotary_factor <= 1.0) {
                let f = rope.partial_rotary_factor;
                return Err(format!("rope_parameters[{t:?}]: partial_rotary_factor {f} is not in (0, 1]"));
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

    pub fn attention(&self, layer: i64) -> AttentionKind {
        match self.layer_types[layer as usize].as_str() {
            "full_attention" => AttentionKind::Full,
            _ => AttentionKind::Sliding,
        }
    }

    pub fn rope(&self, kind: AttentionKind) -> &Rope {
        &self.rope_parameters[match kind {
            AttentionKind::Full => "full_attention",
            AttentionKind::Sliding => "sliding_attention",
        }]
    }

    pub fn head_dim(&self, kind: AttentionKind) -> i64 {
        match kind {
            AttentionKind::Full => self.global_head_dim.unwrap_or(512),
            AttentionKind::Sliding => self.head_dim,
        }
    }

    /// Both kinds of layer: Transformers reads `num_global_key_value_heads` for the full layers only in models that
    /// share values with keys (`attention_k_eq_v`), which `check` refuses.
    pub fn kv_heads(&self, _kind: AttentionKind) -> i64 {
        self.num_key_value_heads
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

    /// Slots of a sliding layer's ring (see `Layout::sliding_ring_len`).
    pub fn ring_len(&self) -> i64 {
        2 * self.sliding_window
    }
}

// --8<-- [start:layout]
/// What the caches look like: which layers own one, and how long a sliding ring is (a full cache holds `ctx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub full_rings: i64,
    pub sliding_rings: i64,
    /// Layers that own no cache and read an earlier layer's instead.
    pub shared_layers: i64,
    /// `window + chunk` with `chunk = window`: a prompt chunk of `window` new tokens still sees the `window`
    /// tokens before it.
    pub sliding_ring_len: i64,
}

pub fn layout(cfg: &TextConfig) -> Layout {
    let owners = 0..cfg.first_shared();
    let full = owners.clone().filter(|&i| cfg.attention(i) == AttentionKind::Full).count() as i64;
    Layout {
        full_rings: full,
        sliding_rings: owners.count() as i64 - full,
        shared_layers: cfg.num_kv_shared_layers,
        sliding_ring_len: cfg.ring_len(),
    }
}
// --8<-- [end:layout]

/// Python sees the layout as a tuple, in the field order.
impl From<Layout> for (i64, i64, i64, i64) {
    fn from(l: Layout) -> Self {
        (l.full_rings, l.sliding_rings, l.shared_layers, l.sliding_ring_len)
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// The real gemma-4-E2B text config (the key layout of the published multimodal config.json).
    pub fn e2b() -> Value {
        json!({"text_config": {
            "hidden_size": 1536, "intermediate_size": 6144, "num_hidden_layers": 35, "num_attention_heads": 8,
            "num_key_value_heads": 1, "head_dim": 256, "global_head_dim": 512, "num_global_key_value_heads": null,
            "hidden_size_per_layer_input": 256, "vocab_size": 262144, "vocab_size_per_layer_input": 262144,
            "num_kv_shared_layers": 20, "use_double_wide_mlp": true, "attention_k_eq_v": false,
            "sliding_window": 512, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
            "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh",
            "layer_types": (0..35).map(|i| if i % 5 == 4 { "full_attention" } else { "sliding_attention" })
                .collect::<Vec<_>>(),
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}
            }
        }})
    }

    /// compressed-tensors' W4A16 config with one group of `weights` settings.
    fn w4a16(weights: Value) -> Value {
        json!({"quant_method": "compressed-tensors", "format": "pack-quantized",
               "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}})
    }

    fn int4(group_size: i64) -> Value {
        json!({"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": group_size})
    }

    pub fn parse(config: &Value) -> Result<Config> {
        Config::parse(&config.to_string(), Path::new("config.json"))
    }

    fn message(config: &Value) -> String {
        parse(config).err().expect("the config should be refused").to_string()
    }

    #[test]
    fn e2b_layout_and_kv_sources() {
        let cfg = parse(&e2b()).unwrap().text;
        let want = Layout { full_rings: 3, sliding_rings: 12, shared_layers: 20, sliding_ring_len: 1024 };
        assert_eq!(layout(&cfg), want);
        assert_eq!(<(i64, i64, i64, i64)>::from(want), (3, 12, 20, 1024));
        // layers 0..15 own their caches; the shared ones read the last owner of their kind: 13 (sliding), 14 (full)
        assert!((0..15).all(|i| cfg.kv_source(i) == i));
        assert_eq!(cfg.kv_source(15), 13);
        assert_eq!(cfg.kv_source(19), 14);
        assert_eq!(cfg.kv_source(34), 14);
        assert_eq!((cfg.intermediate(14), cfg.intermediate(15)), (6144, 12288)); // double-wide when shared
        assert_eq!((cfg.head_dim(AttentionKind::Full), cfg.kv_heads(AttentionKind::Full)), (512, 1));
    }

    #[test]
    fn a_causal_layout_config_reads_the_same() {
        let multimodal = parse(&e2b()).unwrap().text;
        let causal = parse(&e2b()["text_config"]).unwrap().text;
        assert_eq!(layout(&causal), layout(&multimodal));
    }

    #[test]
    fn quantization_config_gives_the_group_size() {
        assert_eq!(parse(&e2b()).unwrap().group_size, None);
        let mut config = e2b();
        config["quantization_config"] = w4a16(int4(32));
        assert_eq!(parse(&config).unwrap().group_size, Some(32));
    }

    #[test]
    fn other_quantizations_are_refused_by_name() {
        let cases = [
            (json!({"quant_method": "gptq"}), "quant_method \"gptq\""),
            (json!({"quant_method": "compressed-tensors", "format": "float-quantized"}), "\"float-quantized\""),
            (w4a16(json!({"num_bits": 8, "type": "int"})), "num_bits Some(8)"),
            (w4a16(json!({"num_bits": 4, "type": "float"})), "type \"float\""),
            (
                w4a16(json!({"num_bits": 4, "type": "int", "symmetric": false, "strategy": "group"})),
                "symmetric Some(false)",
            ),
            (w4a16(json!({"num_bits": 4, "type": "int", "symmetric": true, "strategy": "channel"})), "\"channel\""),
        ];
        for (q, words) in cases {
            let mut config = e2b();
            config["quantization_config"] = q;
            let e = parse(&config).err().expect("refused");
            assert!(matches!(e, Error::Unsupported(_)), "{e}");
            assert!(e.to_string().contains(words), "{e} should say {words}");
        }
        let mut config = e2b();
        config["quantization_config"] = w4a16(int4(0));
        assert!(message(&config).contains("no positive group_size"));
        let mut q = w4a16(int4(32));
        q["config_groups"]["group_1"] = json!({"weights": int4(64)});
        config["quantization_config"] = q;
        assert!(message(&config).contains("mixes group sizes"));
    }

    /// E2B's RoPE parameters with the full layers' type and partial factor replaced.
    fn rope(full_type: &str, partial: f64) -> Value {
        json!({
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": full_type, "partial_rotary_factor": partial, "rope_theta": 1e6}
        })
    }

    #[test]
    fn bad_configs_are_refused_with_the_reason() {
        let garbled = Config::parse("{not json", Path::new("c.json")).err().expect("refused");
        assert!(matches!(&garbled, Error::Invalid(m) if m.starts_with("c.json: not valid JSON")), "{garbled}");
        // (key of the text config, its new value or None to remove it, what the message must say)
        let cases = [
            ("hidden_size", None, "hidden_size"),
            ("head_dim", Some(json!(0)), "head_dim must be positive"),
            ("num_hidden_layers", Some(json!(34)), "35 layer_types for 34 layers"),
            ("layer_types", Some(json!(vec!["chunked_attention"; 35])), "unknown layer type"),
            ("hidden_activation", Some(json!("gelu")), "not gelu_pytorch_tanh"),
            ("attention_k_eq_v", Some(json!(true)), "attention_k_eq_v"),
            ("sliding_window", Some(json!(1_i64 << 62)), "sliding_window = 4611686018427387904: need 0 <="),
            ("vocab_size_per_layer_input", Some(json!(-1)), "vocab_size_per_layer_input = -1"),
            ("num_key_value_heads", Some(json!(3)), "num_attention_heads 8 is not a multiple of num_key_value_heads 3"),
            ("rope_parameters", Some(rope("yarn", 0.25)), "rope_type \"yarn\" is not default or proportional"),
            ("rope_parameters", Some(rope("proportional", 1.5)), "partial_rotary_factor 1.5 is not in (0, 1]"),
            ("num_kv_shared_layers", Some(json!(35)), "num_kv_shared_layers 35 out of range"),
            // 33 shared layers leave sliding layers 0 and 1 as the only owners: a full layer has none to share
            ("num_kv_shared_layers", Some(json!(33)), "KV-shared full_attention layer has no earlier"),
        ];
        for (key, value, words) in cases {
            let mut config = e2b();
            let text = config["text_config"].as_object_mut().unwrap();
            match value {
                Some(v) => text.insert(key.into(), v),
                None => text.remove(key),
            };
            let m = message(&config);
            assert!(m.starts_with("config.json: ") && m.contains(words), "{m} should say {words}");
        }
    }
}
