from kvplan.model.hub_weights import sum_tensors


def test_mtp_layers_are_left_out_and_sizes_come_from_offsets():
    # 2 decoder layers; layer 2 is an MTP draft layer stored beyond num_hidden_layers.
    tensors = [
        ("model.embed_tokens.weight", (0, 1000)),
        ("model.layers.0.mlp.down_proj.weight", (1000, 1500)),
        ("model.layers.1.mlp.down_proj.weight", (1500, 2000)),
        ("model.layers.2.eh_proj.weight", (2000, 2300)),
        ("lm_head.weight", (2300, 3300)),
    ]
    result = sum_tensors(tensors, num_hidden_layers=2)
    assert result.loaded_bytes == 1000 + 500 + 500 + 1000
    assert result.skipped_bytes == 300 and result.tensors == 4


def test_vision_tower_layers_are_kept():
    tensors = [("vision_tower.encoder.layers.30.mlp.weight", (0, 10))]
    assert sum_tensors(tensors, num_hidden_layers=2).loaded_bytes == 10
