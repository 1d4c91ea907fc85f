//! Parsers for model files: Hugging Face `config.json` → [`memwall_core::ModelDesc`].
