//! `kp_source::api::connect`: the server a client talks to and where its address came from,
//! as every connection message names them; a kubeconfig that cannot be used names its server.

use kp_source::api::{ServerOrigin, connect};

fn kubeconfig(dir: &std::path::Path, cluster: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig.conf");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: default\n  cluster:\n{cluster}\
             contexts:\n- name: default\n  context:\n    cluster: default\n    user: default\n\
             current-context: default\nusers:\n- name: default\n  user:\n    tokenFile: token\n"
        ),
    )
    .unwrap();
    std::fs::write(dir.join("token"), "t").unwrap();
    path
}

#[tokio::test]
async fn connect_names_the_server_and_its_origin() {
    let dir = tempfile::tempdir().unwrap();
    let path = kubeconfig(dir.path(), "    server: http://192.0.2.10:6443\n");
    let c = connect(Some(path.clone()), None).await.unwrap();
    assert_eq!(c.server, "http://192.0.2.10:6443");
    assert_eq!(c.origin, ServerOrigin::Kubeconfig(path.clone()));
    assert_eq!(
        c.origin.to_string(),
        format!("from --kubeconfig {}", path.display())
    );

    let c = connect(Some(path), Some("http://127.0.0.1:1".into()))
        .await
        .unwrap();
    assert_eq!(c.server, "http://127.0.0.1:1");
    assert_eq!(c.origin, ServerOrigin::Master);
    assert_eq!(c.origin.to_string(), "from --master");
}

#[tokio::test]
async fn an_unusable_kubeconfig_names_its_server() {
    let dir = tempfile::tempdir().unwrap();
    let path = kubeconfig(
        dir.path(),
        "    server: https://cp.example:6443\n    certificate-authority: /nonexistent/ca.crt\n",
    );
    let err = connect(Some(path.clone()), None).await.unwrap_err();
    assert!(
        err.to_string().starts_with(&format!(
            "invalid kubeconfig {} (server https://cp.example:6443): ",
            path.display()
        )),
        "{err}"
    );
}
