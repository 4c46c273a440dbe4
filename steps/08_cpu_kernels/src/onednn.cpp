// torch's switch for oneDNN (Python: `torch.backends.mkldnn.enabled`), which tch has no call for: two ATen
// calls, exported unmangled so that onednn.rs can declare them.
#include <ATen/Context.h>

extern "C" bool torchtpu_onednn_enabled() { return at::globalContext().userEnabledMkldnn(); }

extern "C" void torchtpu_set_onednn_enabled(bool enabled) { at::globalContext().setUserEnabledMkldnn(enabled); }
