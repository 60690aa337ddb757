# ACL policy for litellm-disagg workers: register, refresh and deregister their own services,
# and keep large RuntimeConfigs in KV under litellm-disagg/.
#   consul acl policy create -name litellm-disagg-worker -rules @worker-policy.hcl
#   consul acl token create -policy-name litellm-disagg-worker   -> CONSUL_HTTP_TOKEN of the workers
service_prefix "litellm-disagg" {
  policy = "write"
}
key_prefix "litellm-disagg/" {
  policy = "write"
}
node_prefix "" {
  policy = "read"
}
