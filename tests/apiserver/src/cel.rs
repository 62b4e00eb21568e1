//! A tiny evaluator for the subset of CEL that LiteIO's `x-kubernetes-validations` use:
//! `has()`, `size()`, field selection on `self`/`oldSelf`, `!`, `&&`, `||`, comparisons,
//! and integer, string, boolean literals.

use serde_json::Value;

/// Why a rule could not be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CelError {
    /// The rule uses syntax outside the supported subset.
    #[error("unsupported CEL expression: {0}")]
    Unsupported(String),
    /// A field that is not set was read.
    #[error("no such key: {0}")]
    NoSuchKey(String),
    /// Operands of the wrong type.
    #[error("no matching overload for {0}")]
    Type(String),
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Int(i64),
    Str(String),
    Op(&'static str),
}

fn tokenize(s: &str) -> Result<Vec<Tok>, CelError> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    const OPS: &[&str] = &[
        "&&", "||", "==", "!=", ">=", "<=", ">", "<", "!", "(", ")", ".", ",", "+", "-",
    ];
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit() {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            let n = text
                .parse()
                .map_err(|_| CelError::Unsupported(text.clone()))?;
            out.push(Tok::Int(n));
        } else if c == '\'' || c == '"' {
            let start = i + 1;
            i += 1;
            while i < chars.len() && chars[i] != c {
                i += 1;
            }
            if i >= chars.len() {
                return Err(CelError::Unsupported("unterminated string".into()));
            }
            out.push(Tok::Str(chars[start..i].iter().collect()));
            i += 1;
        } else {
            let rest: String = chars[i..chars.len().min(i + 2)].iter().collect();
            let op = OPS
                .iter()
                .find(|op| rest.starts_with(**op))
                .ok_or_else(|| CelError::Unsupported(format!("character {c:?}")))?;
            out.push(Tok::Op(op));
            i += op.len();
        }
    }
    Ok(out)
}

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Var(String),
    Select(Box<Expr>, String),
    Has(Box<Expr>, String),
    Size(Box<Expr>),
    Lit(Value),
    Not(Box<Expr>),
    Bin(&'static str, Box<Expr>, Box<Expr>),
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn eat(&mut self, op: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Op(o)) if *o == op) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, op: &str) -> Result<(), CelError> {
        if self.eat(op) {
            Ok(())
        } else {
            Err(CelError::Unsupported(format!("expected '{op}'")))
        }
    }

    fn or(&mut self) -> Result<Expr, CelError> {
        let mut left = self.and()?;
        while self.eat("||") {
            left = Expr::Bin("||", Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, CelError> {
        let mut left = self.rel()?;
        while self.eat("&&") {
            left = Expr::Bin("&&", Box::new(left), Box::new(self.rel()?));
        }
        Ok(left)
    }

    fn rel(&mut self) -> Result<Expr, CelError> {
        let left = self.unary()?;
        for op in ["==", "!=", ">=", "<=", ">", "<"] {
            if self.eat(op) {
                return Ok(Expr::Bin(op, Box::new(left), Box::new(self.unary()?)));
            }
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, CelError> {
        if self.eat("!") {
            return Ok(Expr::Not(Box::new(self.unary()?)));
        }
        if self.eat("-") {
            return match self.toks.get(self.pos).cloned() {
                Some(Tok::Int(n)) => {
                    self.pos += 1;
                    Ok(Expr::Lit(Value::from(-n)))
                }
                _ => Err(CelError::Unsupported("unary minus".into())),
            };
        }
        self.postfix()
    }

    fn postfix(&mut self) -> Result<Expr, CelError> {
        let mut e = self.primary()?;
        while self.eat(".") {
            match self.toks.get(self.pos).cloned() {
                Some(Tok::Ident(f)) => {
                    self.pos += 1;
                    e = Expr::Select(Box::new(e), f);
                }
                _ => return Err(CelError::Unsupported("field name expected".into())),
            }
        }
        Ok(e)
    }

    fn primary(&mut self) -> Result<Expr, CelError> {
        let tok = self
            .toks
            .get(self.pos)
            .cloned()
            .ok_or_else(|| CelError::Unsupported("unexpected end".into()))?;
        self.pos += 1;
        match tok {
            Tok::Int(n) => Ok(Expr::Lit(Value::from(n))),
            Tok::Str(s) => Ok(Expr::Lit(Value::from(s))),
            Tok::Op("(") => {
                let e = self.or()?;
                self.expect(")")?;
                Ok(e)
            }
            Tok::Ident(name) => match name.as_str() {
                "true" => Ok(Expr::Lit(Value::Bool(true))),
                "false" => Ok(Expr::Lit(Value::Bool(false))),
                "null" => Ok(Expr::Lit(Value::Null)),
                "has" => {
                    self.expect("(")?;
                    let arg = self.postfix()?;
                    self.expect(")")?;
                    match arg {
                        Expr::Select(base, field) => Ok(Expr::Has(base, field)),
                        _ => Err(CelError::Unsupported(
                            "has() needs a field selection".into(),
                        )),
                    }
                }
                "size" => {
                    self.expect("(")?;
                    let arg = self.or()?;
                    self.expect(")")?;
                    Ok(Expr::Size(Box::new(arg)))
                }
                "self" | "oldSelf" => Ok(Expr::Var(name)),
                other => Err(CelError::Unsupported(format!("identifier {other}"))),
            },
            Tok::Op(op) => Err(CelError::Unsupported(format!("operator {op}"))),
        }
    }
}

/// A parsed rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    expr: Expr,
    /// Whether the rule reads `oldSelf` (a transition rule, only checked on update).
    pub uses_old_self: bool,
}

fn mentions_old(e: &Expr) -> bool {
    match e {
        Expr::Var(v) => v == "oldSelf",
        Expr::Select(b, _) | Expr::Has(b, _) | Expr::Size(b) | Expr::Not(b) => mentions_old(b),
        Expr::Bin(_, a, b) => mentions_old(a) || mentions_old(b),
        Expr::Lit(_) => false,
    }
}

impl Rule {
    /// Parses a rule; `Unsupported` when it leaves the subset.
    pub fn parse(src: &str) -> Result<Rule, CelError> {
        let mut p = Parser {
            toks: tokenize(src)?,
            pos: 0,
        };
        let expr = p.or()?;
        if p.pos != p.toks.len() {
            return Err(CelError::Unsupported(format!("trailing input in {src}")));
        }
        Ok(Rule {
            uses_old_self: mentions_old(&expr),
            expr,
        })
    }

    /// Evaluates the rule to a boolean.
    pub fn eval(&self, this: &Value, old: Option<&Value>) -> Result<bool, CelError> {
        match eval(&self.expr, this, old)? {
            Value::Bool(b) => Ok(b),
            other => Err(CelError::Type(format!("rule result {other}"))),
        }
    }
}

fn eval(e: &Expr, this: &Value, old: Option<&Value>) -> Result<Value, CelError> {
    match e {
        Expr::Lit(v) => Ok(v.clone()),
        Expr::Var(v) if v == "self" => Ok(this.clone()),
        Expr::Var(v) => old.cloned().ok_or_else(|| CelError::NoSuchKey(v.clone())),
        Expr::Select(base, f) => {
            let b = eval(base, this, old)?;
            b.get(f)
                .filter(|v| !v.is_null())
                .cloned()
                .ok_or_else(|| CelError::NoSuchKey(f.clone()))
        }
        Expr::Has(base, f) => {
            let b = eval(base, this, old)?;
            Ok(Value::Bool(b.get(f).is_some_and(|v| !v.is_null())))
        }
        Expr::Size(arg) => match eval(arg, this, old)? {
            Value::String(s) => Ok(Value::from(s.chars().count())),
            Value::Array(a) => Ok(Value::from(a.len())),
            Value::Object(m) => Ok(Value::from(m.len())),
            other => Err(CelError::Type(format!("size({other})"))),
        },
        Expr::Not(a) => match eval(a, this, old)? {
            Value::Bool(b) => Ok(Value::Bool(!b)),
            other => Err(CelError::Type(format!("!{other}"))),
        },
        Expr::Bin("&&", a, b) => {
            // CEL's commutative logic: an error on one side is absorbed by `false` on the other.
            let l = eval(a, this, old);
            if matches!(l, Ok(Value::Bool(false))) {
                return Ok(Value::Bool(false));
            }
            let r = eval(b, this, old)?;
            match (l?, r) {
                (Value::Bool(x), Value::Bool(y)) => Ok(Value::Bool(x && y)),
                (x, y) => Err(CelError::Type(format!("{x} && {y}"))),
            }
        }
        Expr::Bin("||", a, b) => {
            let l = eval(a, this, old);
            if matches!(l, Ok(Value::Bool(true))) {
                return Ok(Value::Bool(true));
            }
            let r = eval(b, this, old)?;
            match (l?, r) {
                (Value::Bool(x), Value::Bool(y)) => Ok(Value::Bool(x || y)),
                (x, y) => Err(CelError::Type(format!("{x} || {y}"))),
            }
        }
        Expr::Bin(op, a, b) => {
            let (l, r) = (eval(a, this, old)?, eval(b, this, old)?);
            let ord = match (&l, &r) {
                (Value::Number(x), Value::Number(y)) => x
                    .as_f64()
                    .zip(y.as_f64())
                    .and_then(|(x, y)| x.partial_cmp(&y)),
                (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
                _ => None,
            };
            let res = match *op {
                "==" => l == r,
                "!=" => l != r,
                ">" => ord.is_some_and(|o| o.is_gt()),
                "<" => ord.is_some_and(|o| o.is_lt()),
                ">=" => ord.is_some_and(|o| o.is_ge()),
                "<=" => ord.is_some_and(|o| o.is_le()),
                other => return Err(CelError::Unsupported(other.to_string())),
            };
            if ord.is_none() && !matches!(*op, "==" | "!=") {
                return Err(CelError::Type(format!("{l} {op} {r}")));
            }
            Ok(Value::Bool(res))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn liteio_rules() {
        let non_empty = Rule::parse("has(self.uuid) && size(self.uuid) > 0").unwrap();
        assert!(!non_empty.uses_old_self);
        assert!(non_empty.eval(&json!({"uuid": "a"}), None).unwrap());
        assert!(!non_empty.eval(&json!({"uuid": ""}), None).unwrap());
        assert!(!non_empty.eval(&json!({}), None).unwrap());
        let immutable =
            Rule::parse("!has(oldSelf.uuid) || !has(self.uuid) || self.uuid == oldSelf.uuid")
                .unwrap();
        assert!(immutable.uses_old_self);
        let (a, b) = (json!({"uuid": "a"}), json!({"uuid": "b"}));
        assert!(immutable.eval(&a, Some(&a)).unwrap());
        assert!(!immutable.eval(&b, Some(&a)).unwrap());
        assert!(immutable.eval(&b, Some(&json!({}))).unwrap());
    }

    #[test]
    fn unsupported_syntax_is_reported() {
        assert!(matches!(
            Rule::parse("self.all(x, x > 0)"),
            Err(CelError::Unsupported(_))
        ));
        assert!(Rule::parse("self.a >= -1 && (self.b != 'x')").is_ok());
    }
}
