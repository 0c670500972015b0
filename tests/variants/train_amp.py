"""Submissions for `train_amp`: valid styles that must score full, plausible mistakes that must not.

Each entry is the source of the student's exercise cell. A wrong entry names the checks (by a
phrase of their title) that must fail for it. The grader observes on the CPU, and also on a CUDA
GPU when there is one; every entry here is judged on the CPU (a mistake that only shows on a GPU,
such as `torch.autocast("cpu", ...)` hard-coded or inputs left on the CPU, cannot be tested here).
"""
from variants import EVERY_CHECK

CORRECT = {
    "reference_style": '''
def train_amp(model, dataloader, optimizer, criterion, dtype=torch.float16, scaler=None, max_norm=1.0):
    device = next(model.parameters()).device
    if scaler is None:
        scaler = torch.amp.GradScaler(device.type, enabled=(dtype == torch.float16))
    model.train()
    for inputs, targets in dataloader:
        inputs, targets = inputs.to(device), targets.to(device)
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=dtype):
            outputs = model(inputs)
            loss = criterion(outputs, targets)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
    return model
''',
    "loss_outside_autocast_on_float_outputs": '''
def train_amp(model, dataloader, optimizer, criterion, dtype=torch.float16, scaler=None, max_norm=1.0):
    device_type = next(model.parameters()).device.type
    scaler = scaler or torch.amp.GradScaler(device_type, enabled=dtype == torch.float16)
    model.train()
    for x, y in dataloader:
        x, y = x.to(device_type), y.to(device_type)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device_type, dtype=dtype):
            logits = model(x)
        loss = criterion(logits.float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(optimizer.param_groups[0]["params"], max_norm=max_norm, foreach=True)
        scaler.step(optimizer)
        scaler.update()
    return model
''',
    "zero_grad_after_step_and_backward_inside_autocast": '''
import torch
from torch.amp import GradScaler, autocast

def train_amp(model, dataloader, optimizer, criterion, dtype=torch.float16, scaler=None, max_norm=1.0):
    device = next(iter(model.parameters())).device
    scaler = scaler if scaler is not None else GradScaler(device.type, enabled=(dtype is torch.float16))
    model.train()
    for inputs, targets in dataloader:
        inputs = inputs.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        with autocast(device_type=device.type, dtype=dtype):
            loss = criterion(model(inputs), targets)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    return model
''',
    "no_scaler_for_bf16": '''
def train_amp(model, dataloader, optimizer, criterion, dtype=torch.float16, scaler=None, max_norm=1.0):
    device = next(model.parameters()).device
    use_scaler = dtype == torch.float16 or scaler is not None
    if scaler is None and use_scaler:
        scaler = torch.amp.GradScaler(device.type)
    model.train()
    for inputs, targets in dataloader:
        inputs, targets = inputs.to(device), targets.to(device)
        model.zero_grad()
        with torch.autocast(device.type, dtype=dtype):
            loss = criterion(model(inputs), targets)
        if use_scaler:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            optimizer.step()
    return model
''',
    "scaler_enabled_for_bf16_too": '''
def train_amp(model, dataloader, optimizer, criterion, dtype=torch.float16, scaler=None, max_norm=1.0):
    device = next(model.parameters()).device
    if scaler is None:
        scaler = torch.GradScaler(device.type)  # a power-of-two scale is exact in bf16, so it is harmless
    model.train()
    for inputs, targets in dataloader:
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=dtype):
            loss = criterion(model(inputs.to(device)), targets.to(device))
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
    return model
''',
    "zero_grad_between_forward_and_backward": '''
def train_amp(model, dataloader, optimizer, criterion, dtype=torch.float16, scaler=None, max_norm=1.0):
    device = next(model.parameters()).device
    if scaler is None:
        scaler = torch.amp.GradScaler(device.type, enabled=(dtype == torch.float16))
    model.train()
    for inputs, targets in dataloader:
        with torch.autocast(device.type, dtype=dtype):
            loss = criterion(model(inputs.to(device)), targets.to(device))
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
    return model
''',
    "prints_and_warns": '''
import warnings

def train_amp(model, dataloader, optimizer, criterion, dtype=torch.float16, *, scaler=None, max_norm=1.0):
    device = next(model.parameters()).device
    if scaler is None:
        scaler = torch.amp.GradScaler(device.type, enabled=(dtype == torch.float16))
    model.train()
    for i, (inputs, targets) in enumerate(dataloader):
        inputs, targets = inputs.to(device), targets.to(device)
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=dtype):
            loss = criterion(model(inputs), targets)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
        print(f"batch {i}: loss {loss.item():.3f}, scale {scaler.get_scale():g}")
    warnings.warn("a harmless warning: the test cell must still not write to stderr")
    return model
''',
    "keyword_only_scaler_and_a_helper": '''
def train_amp(model, dataloader, optimizer, criterion, dtype=torch.float16, **options):
    device = next(model.parameters()).device
    scaler = options.get("scaler") or torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    max_norm = options.get("max_norm", 1.0)

    def one_batch(inputs, targets):
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=dtype):
            loss = criterion(model(inputs.to(device)), targets.to(device))
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()

    model.train()
    for inputs, targets in dataloader:
        one_batch(inputs, targets)
    return model
''',
}

_BODY = '''
def train_amp(model, dataloader, optimizer, criterion, dtype={default}, scaler=None, max_norm=1.0):
    device = next(model.parameters()).device
    if scaler is None:
        scaler = torch.amp.GradScaler({scaler_args})
    {train}
    for inputs, targets in dataloader:
        inputs, targets = inputs.to(device), targets.to(device)
        {zero}
        with torch.autocast({autocast_args}):
            outputs = model(inputs)
            loss = criterion(outputs, targets)
        {backward}
        {clip}
        {step}
        scaler.update()
    return {ret}
'''


_CLIP = "scaler.unscale_(optimizer); torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)"


def _variant(default="torch.float16", scaler_args="device.type, enabled=(dtype == torch.float16)",
             train="model.train()", zero="optimizer.zero_grad()", autocast_args="device.type, dtype=dtype",
             backward="scaler.scale(loss).backward()", clip=_CLIP, step="scaler.step(optimizer)", ret="model"):
    return _BODY.format(default=default, scaler_args=scaler_args, train=train, zero=zero,
                        autocast_args=autocast_args, backward=backward, clip=clip, step=step, ret=ret)


WRONG = {
    # Section 4's trap: clipping the gradients while they are still S times too large, then stepping
    "clips_before_unscaling": (_variant(clip="torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)"),
                               ["clips the gradient norm"]),
    "never_clips": (_variant(clip="pass"), ["clips the gradient norm"]),
    "clips_before_unscaling_then_unscales": (_variant(
        clip="torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm); scaler.unscale_(optimizer)"),
        ["clips the gradient norm"]),
    # The seed's solution, as printed: the torch.cuda.amp spelling does nothing on a CPU (with warnings).
    "seed_torch_cuda_amp": ('''
import torch
from torch.cuda.amp import autocast, GradScaler

def train_amp(model, dataloader, optimizer, criterion, dtype=torch.float16, scaler=None):
    scaler = GradScaler()
    model.train()
    for inputs, targets in dataloader:
        optimizer.zero_grad()
        with autocast():
            outputs = model(inputs)
            loss = criterion(outputs, targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return model
''', ["under autocast", "dtype argument", "overflow", "one GradScaler"]),
    "no_autocast": (_variant(autocast_args="device.type, enabled=False"), ["under autocast", "dtype argument"]),
    "hard_coded_float16": (_variant(autocast_args="device.type, dtype=torch.float16"),
                           ["dtype argument", "bfloat16"]),
    "bf16_by_default": (_variant(default="torch.bfloat16"), ["under autocast", "float16 with a GradScaler"]),
    "autocast_on_the_loss_only": ('''
def train_amp(model, dataloader, optimizer, criterion, dtype=torch.float16, scaler=None):
    device = next(model.parameters()).device
    if scaler is None:
        scaler = torch.amp.GradScaler(device.type, enabled=(dtype == torch.float16))
    model.train()
    for inputs, targets in dataloader:
        optimizer.zero_grad()
        outputs = model(inputs.to(device))
        with torch.autocast(device.type, dtype=dtype):
            loss = criterion(outputs, targets.to(device))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return model
''', ["under autocast", "dtype argument"]),
    "model_half_instead_of_autocast": ('''
def train_amp(model, dataloader, optimizer, criterion, dtype=torch.float16, scaler=None):
    model.to(dtype)
    model.train()
    device = next(model.parameters()).device
    for inputs, targets in dataloader:
        optimizer.zero_grad()
        loss = criterion(model(inputs.to(device, dtype)).float(), targets.to(device))
        loss.backward()
        optimizer.step()
    return model
''', ["master weights", "overflow", "one GradScaler"]),
    "scaler_without_device_type": (_variant(scaler_args=""), ["overflow", "one GradScaler"]),
    "no_scaler_in_fp16": ('''
def train_amp(model, dataloader, optimizer, criterion, dtype=torch.float16, scaler=None):
    device = next(model.parameters()).device
    model.train()
    for inputs, targets in dataloader:
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=dtype):
            loss = criterion(model(inputs.to(device)), targets.to(device))
        loss.backward()
        optimizer.step()
    return model
''', ["overflow", "one GradScaler"]),
    "loss_not_scaled": (_variant(backward="loss.backward()"), ["float16 with a GradScaler", "overflow"]),
    # after scaler.unscale_ a plain optimizer.step() steps with the right gradients; only an overflow shows it
    "optimizer_step_instead_of_scaler_step": (_variant(step="optimizer.step()"), ["overflow"]),
    "steps_twice": (_variant(step="scaler.step(optimizer); optimizer.step()"),
                    ["float16 with a GradScaler", "bfloat16", "overflow"]),
    "new_scaler_every_batch": ('''
def train_amp(model, dataloader, optimizer, criterion, dtype=torch.float16, scaler=None):
    device = next(model.parameters()).device
    model.train()
    for inputs, targets in dataloader:
        scaler = torch.amp.GradScaler(device.type, enabled=(dtype == torch.float16))
        inputs, targets = inputs.to(device), targets.to(device)
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=dtype):
            loss = criterion(model(inputs), targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return model
''', ["one GradScaler", "passed as scaler="]),
    # The exercise before it took a scaler: correct then, it now lacks the argument a run needs.
    "no_scaler_argument": ('''
def train_amp(model, dataloader, optimizer, criterion, dtype=torch.float16):
    device = next(model.parameters()).device
    scaler = torch.amp.GradScaler(device.type, enabled=(dtype == torch.float16))
    model.train()
    for inputs, targets in dataloader:
        inputs, targets = inputs.to(device), targets.to(device)
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=dtype):
            loss = criterion(model(inputs), targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return model
''', ["passed as scaler="]),
    "ignores_the_given_scaler": (_variant().replace("    if scaler is None:\n        scaler =", "    scaler ="),
                                 ["passed as scaler="]),
    "copies_the_given_scale_into_a_new_scaler": (_variant(scaler_args="device.type").replace(
        "    if scaler is None:\n        scaler = torch.amp.GradScaler(device.type)",
        "    scaler = torch.amp.GradScaler(device.type, init_scale=scaler.get_scale() if scaler else 2.0**16)"),
        ["passed as scaler="]),
    "update_once_after_the_loop": ('''
def train_amp(model, dataloader, optimizer, criterion, dtype=torch.float16, scaler=None):
    device = next(model.parameters()).device
    if scaler is None:
        scaler = torch.amp.GradScaler(device.type, enabled=(dtype == torch.float16))
    model.train()
    for inputs, targets in dataloader:
        inputs, targets = inputs.to(device), targets.to(device)
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=dtype):
            loss = criterion(model(inputs), targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
    scaler.update()
    return model
''', ["float16 with a GradScaler", "overflow", "one GradScaler"]),
    "never_zeroes_gradients": (_variant(zero="pass"), ["bfloat16", "overflow", "every batch"]),
    "forgets_train_mode": (_variant(train="pass"), ["training mode"]),
    "returns_nothing": (_variant(ret="None"), ["Returns the model"]),
    "returns_a_copy": (_variant(ret="copy.deepcopy(model)").replace("\ndef", "\nimport copy\n\ndef", 1),
                       ["Returns the model"]),
    "returns_the_model_untrained": ('''
def train_amp(model, dataloader, optimizer, criterion, dtype=torch.float16, scaler=None):
    model.train()
    return model
''', EVERY_CHECK),
    "not_implemented": ('''
def train_amp(model, dataloader, optimizer, criterion, dtype=torch.float16, scaler=None):
    # YOUR CODE HERE
    raise NotImplementedError()
''', ["Returns the model", "under autocast", "overflow"]),
}
