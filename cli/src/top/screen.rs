//! The refreshing view: scrapes the agents every interval and redraws the frame until `q`
//! or Ctrl-C. On a terminal it draws on the alternate screen with the cursor hidden and
//! reads keys without waiting for Enter (no echo); all of it is undone on the way out,
//! also after an error. Elsewhere (output to a pipe) it prints one frame after the other.

use std::io::{IsTerminal, Read, Write};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use rustix::termios::{LocalModes, OptionalActions, SpecialCodeIndex, Termios};

use super::{AgentReading, Frame, Unreachable, frame, http, render, text};

/// How long one agent may take to answer.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// Scrapes every URL at once; `start` is the origin of the readings' clock.
pub async fn scrape(urls: &[String], start: Instant) -> (Vec<AgentReading>, Vec<Unreachable>) {
    let mut set = tokio::task::JoinSet::new();
    for (i, url) in urls.iter().enumerate() {
        let url = url.clone();
        set.spawn(async move {
            let r = http::get(&url, SCRAPE_TIMEOUT).await;
            let at = start.elapsed().as_secs_f64();
            let r = r.and_then(|body| {
                text::parse(&body)
                    .map(|s| AgentReading::new(&url, at, &s))
                    .map_err(|e| format!("not Prometheus text: {e}"))
            });
            (i, url, r)
        });
    }
    let mut done = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Ok(r) = r {
            done.push(r);
        }
    }
    done.sort_by_key(|(i, _, _)| *i);
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for (_, url, r) in done {
        match r {
            Ok(reading) => ok.push(reading),
            Err(error) => bad.push(Unreachable { url, error }),
        }
    }
    (ok, bad)
}

/// One frame: two scrapes `interval` apart.
pub async fn once(urls: &[String], interval: Duration) -> Frame {
    let start = Instant::now();
    let (first, _) = scrape(urls, start).await;
    tokio::time::sleep(interval).await;
    let (second, bad) = scrape(urls, start).await;
    frame(&first, &second, bad)
}

/// The title line of a live frame.
fn title(agents: usize, interval: Duration) -> String {
    format!(
        "kubectl liteio top · {agents} agents · every {}s · {} · q or Ctrl-C quits",
        interval.as_secs_f64(),
        Timestamp::now().strftime("%H:%M:%S UTC")
    )
}

/// The terminal as the view uses it; dropping it gives the terminal back as it was.
struct Screen {
    /// Stdout is a terminal: draw on the alternate screen.
    tty_out: bool,
    /// Stdin's settings before the view changed them.
    saved: Option<Termios>,
}

impl Screen {
    fn enter() -> Self {
        let tty_out = std::io::stdout().is_terminal();
        if tty_out {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(b"\x1b[?1049h\x1b[?25l");
            let _ = out.flush();
        }
        let stdin = std::io::stdin();
        let saved = if stdin.is_terminal() {
            rustix::termios::tcgetattr(&stdin).ok().and_then(|orig| {
                let mut t = orig.clone();
                // Keys arrive one by one and are not echoed; Ctrl-C still sends SIGINT.
                t.local_modes.remove(LocalModes::ICANON | LocalModes::ECHO);
                t.special_codes[SpecialCodeIndex::VMIN] = 1;
                t.special_codes[SpecialCodeIndex::VTIME] = 0;
                rustix::termios::tcsetattr(&stdin, OptionalActions::Now, &t)
                    .ok()
                    .map(|()| orig)
            })
        } else {
            None
        };
        Self { tty_out, saved }
    }

    fn draw(&self, text: &str) {
        let mut out = std::io::stdout().lock();
        if self.tty_out {
            let _ = out.write_all(b"\x1b[H\x1b[2J");
            let _ = out.write_all(text.as_bytes());
        } else {
            let _ = out.write_all(text.as_bytes());
            let _ = out.write_all(b"\n");
        }
        let _ = out.flush();
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        if let Some(t) = &self.saved {
            let _ = rustix::termios::tcsetattr(std::io::stdin(), OptionalActions::Now, t);
        }
        if self.tty_out {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(b"\x1b[?25h\x1b[?1049l");
            let _ = out.flush();
        }
    }
}

/// Keys typed on stdin, one byte at a time, from a thread of their own (a blocking read);
/// the channel closes at the end of input.
fn keys() -> tokio::sync::mpsc::UnboundedReceiver<u8> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut b = [0u8; 1];
        while let Ok(1) = stdin.read(&mut b) {
            if tx.send(b[0]).is_err() {
                break;
            }
        }
    });
    rx
}

/// Scrapes `urls` every `interval` and redraws the `limit` busiest volumes and the pools
/// until `q` (or `Q`) is typed or Ctrl-C is pressed; returns then, the terminal restored.
pub async fn live(urls: &[String], interval: Duration, limit: usize) {
    let screen = Screen::enter();
    let mut keys = keys();
    let mut input_open = true;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let start = Instant::now();
    let mut prev: Vec<AgentReading> = Vec::new();
    let mut next = tokio::time::Instant::now();
    loop {
        let (cur, bad) = scrape(urls, start).await;
        let f = frame(&prev, &cur, bad);
        screen.draw(&render(&f, &title(urls.len(), interval), limit));
        // An agent that did not answer keeps its last reading: its next rates span the gap.
        let mut kept: Vec<AgentReading> = prev
            .into_iter()
            .filter(|p| f.unreachable.iter().any(|u| u.url == p.url))
            .collect();
        kept.extend(cur);
        prev = kept;
        next += interval;
        let now = tokio::time::Instant::now();
        if next < now {
            next = now;
        }
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next) => break,
                k = keys.recv(), if input_open => match k {
                    Some(b'q' | b'Q') => return,
                    Some(_) => {}
                    None => input_open = false,
                },
                _ = &mut ctrl_c => return,
            }
        }
    }
}
