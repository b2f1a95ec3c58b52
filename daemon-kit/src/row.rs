//! A feature row given on a command line: `--features a,b,...` or
//! `--features-file row.f32` (raw little-endian f32), as `sidecarctl graph
//! add-node` and `gnn-worker predict --new-node` take it.

use std::path::Path;

/// Reads the row from exactly one of `text` (comma separated numbers) and
/// `file` (little-endian f32 values); the error names the flag to fix.
pub fn feature_row(text: Option<&str>, file: Option<&Path>) -> Result<Vec<f32>, String> {
    match (text, file) {
        (Some(text), None) => text
            .split(',')
            .map(|v| {
                v.trim()
                    .parse::<f32>()
                    .map_err(|_| format!("{v:?} in --features is not a number"))
            })
            .collect(),
        (None, Some(path)) => {
            let bytes =
                std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
            if bytes.len() % 4 != 0 {
                return Err(format!(
                    "{} is not a whole number of f32 values ({} bytes)",
                    path.display(),
                    bytes.len()
                ));
            }
            Ok(bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect())
        }
        (Some(_), Some(_)) => Err("give the feature row with --features or --features-file, \
                                  not both"
            .into()),
        (None, None) => Err("give the feature row with --features or --features-file".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_comes_from_text_or_a_file_and_mistakes_name_the_flag() {
        assert_eq!(
            feature_row(Some("1, -2.5,3"), None),
            Ok(vec![1.0, -2.5, 3.0])
        );
        let err = feature_row(Some("1,x"), None).unwrap_err();
        assert!(err.contains("\"x\" in --features"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("row.f32");
        std::fs::write(&path, [0.5f32, 2.0].map(f32::to_le_bytes).concat()).unwrap();
        assert_eq!(feature_row(None, Some(&path)), Ok(vec![0.5, 2.0]));
        std::fs::write(&path, [0u8; 6]).unwrap();
        assert!(feature_row(None, Some(&path))
            .unwrap_err()
            .contains("not a whole number"));
        assert!(feature_row(None, None).unwrap_err().contains("--features"));
    }
}
