import torch, transformers
cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=4096,
                               use_cache=False)
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(0, 4096, (4, 256))
batch = {"input_ids": ids, "labels": ids.clone()}
for _ in range(3):
    loss = model(**batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
