"""``ckptprof predict``: a checkpoint's save and restore at scale, from one node's
measurements on the target storage and the limits one node cannot measure."""
