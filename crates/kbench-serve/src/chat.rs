//! The chat template `/v1/chat/completions` renders messages with. The tiny checkpoints ship
//! no `chat_template`, so kbench uses one of its own (docs/serve.md): `<s>`, then one
//! `role: content` line per message, then `assistant:` for the reply.

use serde::Deserialize;

use crate::error::ApiError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: String,
    pub content: Content,
    #[serde(default)]
    pub name: Option<String>,
}

/// OpenAI accepts a string or a list of parts; only text parts are supported.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

pub fn render(messages: &[Message]) -> Result<String, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request("`messages` is empty").with_param("messages"));
    }
    let mut out = String::from("<s>");
    for m in messages {
        if !ROLES.contains(&m.role.as_str()) {
            return Err(ApiError::bad_request(format!(
                "unknown role `{}` (expected one of {})",
                m.role,
                ROLES.join(", ")
            ))
            .with_param("messages"));
        }
        let text = match &m.content {
            Content::Text(t) => t.clone(),
            Content::Parts(parts) => {
                let mut t = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(s)) => t.push_str(s),
                        (kind, _) => {
                            return Err(ApiError::bad_request(format!(
                                "content part of type `{kind}` is not supported (text only)"
                            ))
                            .with_param("messages"))
                        }
                    }
                }
                t
            }
        };
        out.push('\n');
        out.push_str(&m.role);
        out.push_str(": ");
        out.push_str(&text);
    }
    out.push_str("\nassistant:");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_roles_in_order() {
        let m: Vec<Message> = serde_json::from_str(
            r#"[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}]"#,
        )
        .unwrap();
        assert_eq!(
            render(&m).unwrap(),
            "<s>\nsystem: be brief\nuser: hi\nassistant:"
        );
        let bad: Vec<Message> =
            serde_json::from_str(r#"[{"role":"robot","content":"x"}]"#).unwrap();
        assert!(render(&bad).is_err());
    }
}
