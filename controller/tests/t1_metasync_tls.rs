//! T1: MetaSync's PostgreSQL credentials and TLS against a real server.
//!
//! The shared test server of scripts/test.sh runs without TLS and with trust
//! authentication, so this file starts its own private cluster: initdb with SCRAM password
//! authentication on TCP, `ssl=on` with a server certificate signed by a throwaway CA made
//! here (rcgen), on 127.0.0.1 and a free port, run as the `postgres` OS user when the test
//! runs as root (the server refuses root). It is stopped when the test ends, also on failure.
//!
//! Without PostgreSQL server binaries (`/usr/lib/postgresql/*/bin`) the test prints one
//! `SKIP …` line and passes, like the other PostgreSQL tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use liteio_controller::config::MetaSyncConfig;
use liteio_controller::metasync::MetaSync;
use liteio_controller::metasync::credentials::SecretKeyRef;
use liteio_controller::metasync::postgres::TlsMode;
use liteio_controller::plugin::{Kind, PluginObject};
use liteio_controller::state::ObjectKey;
use liteio_controller::testing::pool;
use liteio_test_apiserver::TestApiServer;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use tokio::time::timeout;

const LIMIT: Duration = Duration::from_secs(180);
const PASSWORD: &str = "pw-Zq83-not-in-any-log";
const USER: &str = "liteio";
const NS: &str = common::NS;

/// Every log line of this test binary (all levels down to debug), to grep for passwords.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Installs the capture as the process's subscriber (one test runs per process here).
    fn install() -> Self {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("one subscriber per test binary");
        logs
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// A throwaway CA and its PEM.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { issuer }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for `names` (PEM certificate, PEM key).
    fn server(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "liteio test server");
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn pg_bin() -> Option<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            Some((v, e.path().join("bin")))
        })
        .filter(|(_, p)| p.join("initdb").is_file() && p.join("pg_ctl").is_file())
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, p)| p)
}

/// The uid and gid of `postgres` when this test runs as root (the server must not).
fn run_as() -> Result<Option<(u32, u32)>, String> {
    let id = |args: &[&str]| -> Result<u32, String> {
        let out = Command::new("id")
            .args(args)
            .output()
            .map_err(|e| format!("id: {e}"))?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|_| format!("id {args:?} printed no number"))
    };
    if id(&["-u"])? != 0 {
        return Ok(None);
    }
    Ok(Some((
        id(&["-u", "postgres"]).map_err(|_| "running as root and there is no postgres user")?,
        id(&["-g", "postgres"])?,
    )))
}

/// A private PostgreSQL cluster with TLS and SCRAM, stopped on drop.
struct Server {
    bin: PathBuf,
    dir: tempfile::TempDir,
    as_postgres: bool,
    port: u16,
}

impl Server {
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    /// Starts a cluster whose certificate (signed by `ca`) names `names`; `Err` says why
    /// it could not (the caller skips).
    fn start(ca: &Ca, names: &[&str]) -> Result<Self, String> {
        let bin = pg_bin().ok_or("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin")?;
        let owner = run_as()?;
        let dir = tempfile::Builder::new()
            .prefix("liteio-pg-tls.")
            .tempdir_in("/tmp")
            .map_err(|e| e.to_string())?;
        let (cert, key) = ca.server(names);
        let root = dir.path().to_path_buf();
        let root = root.as_path();
        std::fs::write(root.join("server.crt"), cert).map_err(|e| e.to_string())?;
        std::fs::write(root.join("server.key"), key).map_err(|e| e.to_string())?;
        // The initial superuser's password, handed to initdb in a file, not on its command line.
        std::fs::write(root.join("pwfile"), format!("{PASSWORD}\n")).map_err(|e| e.to_string())?;
        use std::os::unix::fs::PermissionsExt;
        for f in ["server.key", "pwfile"] {
            std::fs::set_permissions(root.join(f), std::fs::Permissions::from_mode(0o600))
                .map_err(|e| e.to_string())?;
        }
        if let Some((uid, gid)) = owner {
            for p in [
                root,
                &root.join("server.crt"),
                &root.join("server.key"),
                &root.join("pwfile"),
            ] {
                std::os::unix::fs::chown(p, Some(uid), Some(gid)).map_err(|e| e.to_string())?;
            }
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let server = Self {
            bin,
            dir,
            as_postgres: owner.is_some(),
            port,
        };
        let data = root.join("data");
        run(server
            .command("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", USER, "-E", "UTF8", "--no-sync"])
            .args(["--auth-local=trust", "--auth-host=scram-sha-256"])
            .arg(format!("--pwfile={}", root.join("pwfile").display())))?;
        let opts = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -k '{dir}' -c fsync=off \
             -c ssl=on -c ssl_cert_file='{dir}/server.crt' -c ssl_key_file='{dir}/server.key'",
            dir = root.display()
        );
        run(server
            .command("pg_ctl")
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(root.join("server.log"))
            .args(["-w", "-t", "60", "-o", &opts, "start"]))
        .map_err(|e| {
            let log = std::fs::read_to_string(root.join("server.log")).unwrap_or_default();
            format!("{e}\n{log}")
        })?;
        Ok(server)
    }

    fn url(&self, host: &str, query: &str) -> String {
        format!("postgres://{USER}@{host}:{}/postgres?{query}", self.port)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        let _ = run(self.command("pg_ctl").arg("-D").arg(&data).args([
            "-m",
            "immediate",
            "-w",
            "-t",
            "30",
            "stop",
        ]));
    }
}

fn config(url: String) -> MetaSyncConfig {
    MetaSyncConfig {
        postgres_url: Some(url),
        cluster: "tls".into(),
        ..MetaSyncConfig::default()
    }
}

/// Opens, connects, writes and reads back one row; returns whether the session is TLS.
async fn works(m: &MetaSync) -> Result<bool, String> {
    m.connect().await.map_err(|e| e.chain())?;
    let p = pool("p1", 1 << 30);
    m.upsert(PluginObject::Pool(&p.0))
        .await
        .map_err(|e| e.chain())?;
    let row = m
        .row(Kind::Pool, &ObjectKey::new("obnvmf", "p1"))
        .await
        .map_err(|e| e.chain())?;
    assert!(row.is_some());
    let client = m.as_postgres().unwrap().connect().await.unwrap();
    let ssl: bool = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    Ok(ssl)
}

async fn fails(m: &MetaSync) -> String {
    let err = m.connect().await.expect_err("connect should fail").chain();
    assert!(!err.contains(PASSWORD), "the password leaked: {err}");
    err
}

fn skip_or_start(ca: &Ca, names: &[&str]) -> Option<Server> {
    match Server::start(ca, names) {
        Ok(s) => Some(s),
        Err(why)
            if pg_bin().is_none() || std::env::var_os("LITEIO_TEST_POSTGRES_SKIP").is_some() =>
        {
            println!("SKIP postgres_tls_and_password_sources: {why}");
            None
        }
        Err(why) => panic!("PostgreSQL binaries are here but the TLS server did not start: {why}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_tls_and_password_sources() {
    let logs = Logs::install();
    timeout(LIMIT, async {
        let ca = Ca::new("liteio test CA");
        let Some(server) = tokio::task::block_in_place(|| skip_or_start(&ca, &["localhost"]))
        else {
            return;
        };
        let ca_file = server.write("ca.pem", &ca.pem());
        let other_ca = server.write("other-ca.pem", &Ca::new("someone else's CA").pem());
        let pw_file = server.write("pw", &format!("{PASSWORD}\n"));
        let wrong_pw = server.write("wrong-pw", "not-the-password-Yx1\n");

        // sslmode=require without a CA: encrypted, not authenticated.
        let mut c = config(server.url("127.0.0.1", "sslmode=require"));
        c.password_file = Some(pw_file.clone());
        let m = MetaSync::open(&c).unwrap();
        assert_eq!(m.as_postgres().unwrap().tls_mode(), TlsMode::Require);
        assert!(works(&m).await.unwrap(), "require: the session is TLS");

        // sslmode=disable against the same server: plain.
        let mut c = config(server.url("127.0.0.1", "sslmode=disable"));
        c.password_file = Some(pw_file.clone());
        assert!(!works(&MetaSync::open(&c).unwrap()).await.unwrap());

        // verify-full with the right CA and the name on the certificate.
        let mut c = config(server.url("localhost", "sslmode=verify-full"));
        c.password_file = Some(pw_file.clone());
        c.ca_file = Some(ca_file.clone());
        assert!(works(&MetaSync::open(&c).unwrap()).await.unwrap());

        // verify-full with a CA that did not sign the certificate.
        c.ca_file = Some(other_ca.clone());
        let err = fails(&MetaSync::open(&c).unwrap()).await;
        assert!(
            err.contains(
                "server certificate not trusted (sslmode=verify-full, CA from metaSync.caFile"
            ),
            "{err}"
        );

        // verify-full to an address the certificate does not name; verify-ca accepts it.
        let mut c = config(server.url("127.0.0.1", "sslmode=verify-full"));
        c.password_file = Some(pw_file.clone());
        c.ca_file = Some(ca_file.clone());
        let err = fails(&MetaSync::open(&c).unwrap()).await;
        assert!(
            err.contains("server certificate does not name the host"),
            "{err}"
        );
        let query = format!("sslmode=verify-ca&sslrootcert={}", ca_file.display());
        let mut c = config(server.url("127.0.0.1", &query));
        c.password_file = Some(pw_file.clone());
        assert!(works(&MetaSync::open(&c).unwrap()).await.unwrap());

        // require with a CA is verify-ca (libpq): the wrong CA is refused.
        let mut c = config(server.url("127.0.0.1", "sslmode=require"));
        c.password_file = Some(pw_file.clone());
        c.ca_file = Some(other_ca.clone());
        let err = fails(&MetaSync::open(&c).unwrap()).await;
        assert!(
            err.contains("server certificate not trusted (sslmode=require"),
            "{err}"
        );

        // A wrong password: refused, and nowhere in the error or Debug output.
        let mut c = config(server.url("127.0.0.1", "sslmode=require"));
        c.password_file = Some(wrong_pw);
        let m = MetaSync::open(&c).unwrap();
        let err = fails(&m).await;
        assert!(err.contains("password authentication failed"), "{err}");
        assert!(!err.contains("not-the-password-Yx1"), "{err}");
        // The controller running with the wrong password: the reconcile fails, is logged
        // and retried, and neither password is in any log line.
        let mut controller_config = common::test_config();
        controller_config.meta_sync = Some(c.clone());
        let h = common::start_with(controller_config, vec![Arc::new(m.clone())]).await;
        h.add_pool(pool("p-logs", 1 << 30)).await;
        common::eventually("the refused login is logged", || async {
            logs.text().contains("password authentication failed")
        })
        .await;
        h.stop().await;
        // The URL's own password works too, and is not shown.
        let url = format!(
            "postgres://{USER}:{PASSWORD}@127.0.0.1:{}/postgres?sslmode=require",
            server.port
        );
        let m = MetaSync::open(&config(url)).unwrap();
        assert!(works(&m).await.unwrap());
        assert!(!format!("{m:?} {c:?}").contains(PASSWORD));

        // From a Secret in the controller's namespace.
        let api_server = TestApiServer::start().await.unwrap();
        let client = api_server.client().await.unwrap();
        let ns = k8s_openapi::api::core::v1::Namespace {
            metadata: ObjectMeta {
                name: Some(NS.into()),
                ..ObjectMeta::default()
            },
            ..Default::default()
        };
        Api::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some("pg".into()),
                ..ObjectMeta::default()
            },
            data: Some(
                [(
                    "password".to_string(),
                    ByteString(format!("{PASSWORD}\n").into_bytes()),
                )]
                .into(),
            ),
            ..Secret::default()
        };
        Api::<Secret>::namespaced(client.clone(), NS)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        let mut c = config(server.url("localhost", "sslmode=verify-full"));
        c.ca_file = Some(ca_file.clone());
        c.password_secret = Some(SecretKeyRef {
            name: "pg".into(),
            key: "password".into(),
        });
        let err = MetaSync::open(&c).unwrap_err().to_string();
        assert!(err.contains("metaSync.passwordSecret"), "{err}");
        let m = MetaSync::open_in(&c, &client, NS).unwrap();
        assert!(works(&m).await.unwrap());
        assert!(!format!("{m:?}").contains(PASSWORD));
        c.password_secret = Some(SecretKeyRef {
            name: "pg".into(),
            key: "nope".into(),
        });
        let err = fails(&MetaSync::open_in(&c, &client, NS).unwrap()).await;
        assert!(
            err.contains("metaSync.passwordSecret.key: Secret obnvmf/pg has no key \"nope\""),
            "{err}"
        );
        c.password_secret = Some(SecretKeyRef {
            name: "absent".into(),
            key: "password".into(),
        });
        let err = fails(&MetaSync::open_in(&c, &client, NS).unwrap()).await;
        assert!(err.contains("Secret obnvmf/absent does not exist"), "{err}");

        // From an environment variable: set in a child run of this test binary (changing
        // this process's environment is unsafe while other tests run).
        let url = server.url("localhost", "sslmode=verify-full");
        let out = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "password_from_env_child",
                "--ignored",
                "--nocapture",
            ])
            .env("LITEIO_TEST_PG_PASSWORD", PASSWORD)
            .env("LITEIO_TEST_PG_CHILD_URL", &url)
            .env("LITEIO_TEST_PG_CHILD_CA", &ca_file)
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("env password: TLS session"), "{stdout}");
        assert!(!stdout.contains(PASSWORD), "{stdout}");
        drop(server);
        let text = logs.text();
        assert!(
            text.contains("connected to PostgreSQL"),
            "the capture works"
        );
        assert!(!text.contains(PASSWORD), "the password is in a log line");
        assert!(
            !text.contains("not-the-password-Yx1"),
            "the wrong password is in a log line"
        );
    })
    .await
    .unwrap();
}

/// Run by `postgres_tls_and_password_sources` in a child process with the password in
/// `LITEIO_TEST_PG_PASSWORD`.
#[tokio::test]
#[ignore = "run by postgres_tls_and_password_sources in a child process"]
async fn password_from_env_child() {
    timeout(LIMIT, async {
        let (Ok(url), Some(ca)) = (
            std::env::var("LITEIO_TEST_PG_CHILD_URL"),
            std::env::var_os("LITEIO_TEST_PG_CHILD_CA"),
        ) else {
            println!("SKIP password_from_env_child: run by postgres_tls_and_password_sources");
            return;
        };
        let mut c = config(url);
        c.ca_file = Some(Path::new(&ca).to_path_buf());
        c.password_env = Some("LITEIO_TEST_PG_PASSWORD".into());
        let m = MetaSync::open(&c).unwrap();
        assert!(works(&m).await.unwrap());
        println!("env password: TLS session");
        c.password_env = Some("LITEIO_TEST_PG_PASSWORD_UNSET".into());
        let err = fails(&MetaSync::open(&c).unwrap()).await;
        assert!(
            err.contains("metaSync.passwordEnv: environment variable LITEIO_TEST_PG_PASSWORD_UNSET is not set"),
            "{err}"
        );
    })
    .await
    .unwrap();
}
