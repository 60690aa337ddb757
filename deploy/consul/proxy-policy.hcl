# ACL policy for LiteLLM proxies running the litellm-disagg plugin: read-only discovery.
service_prefix "litellm-disagg" {
  policy = "read"
}
key_prefix "litellm-disagg/" {
  policy = "read"
}
node_prefix "" {
  policy = "read"
}
