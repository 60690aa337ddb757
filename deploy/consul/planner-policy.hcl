# ACL policy for a planner (in the proxies: litellm_disagg.planner.enabled, or `litellm-disagg planner`), on top of
# proxy-policy.hcl: write role and drain requests (registry role_kv_prefix), hold the one-planner lock (a session
# and the key litellm-disagg/planner/leader).
#   consul acl policy create -name litellm-disagg-planner -rules @planner-policy.hcl
#   consul acl token update -id <the proxies' token> -policy-name litellm-disagg-proxy -policy-name litellm-disagg-planner
key_prefix "litellm-disagg/roles/" {
  policy = "write"
}
key "litellm-disagg/planner/leader" {
  policy = "write"
}
session_prefix "" {
  policy = "write"
}
