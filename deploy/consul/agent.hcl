# Consul client agent on every worker and proxy host. Workers and proxies talk to this local agent
# (CONSUL_HTTP_ADDR=https://127.0.0.1:8501); it forwards to the servers.
datacenter = "dc1"
data_dir   = "/opt/consul"
server     = false
retry_join = ["consul-server-1.internal", "consul-server-2.internal", "consul-server-3.internal"]

bind_addr   = "{{ GetPrivateIP }}"
client_addr = "127.0.0.1"

ports {
  http  = -1     # plain HTTP off
  https = 8501
}

tls {
  defaults {
    ca_file         = "/etc/consul.d/tls/ca.pem"
    cert_file       = "/etc/consul.d/tls/agent.pem"
    key_file        = "/etc/consul.d/tls/agent-key.pem"
    verify_incoming = false   # local clients (workers, proxy) present no client certificate
    verify_outgoing = true
  }
}

acl {
  enabled        = true
  default_policy = "deny"
  tokens {
    agent = "REPLACE-WITH-AGENT-TOKEN"
  }
}
