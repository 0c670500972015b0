"""Submissions for `train_with_accumulation`: valid styles that must score full, plausible mistakes that must not.

Each entry is the source of the student's exercise cell. A wrong entry names the checks (by a
phrase of their title) that must fail for it.
"""
from variants import EVERY_CHECK

CORRECT = {
    "seed_style": '''
def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    model.train()
    total_loss = 0
    optimizer.zero_grad()
    for i, (inputs, targets) in enumerate(dataloader):
        outputs = model(inputs)
        loss = criterion(outputs, targets)
        loss = loss / accumulation_steps
        loss.backward()
        total_loss += loss.item() * accumulation_steps
        if (i + 1) % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    return total_loss / len(dataloader)
''',
    "set_to_none_and_start_1": '''
def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    model.train()
    optimizer.zero_grad(set_to_none=True)
    losses = []
    for step, (x, y) in enumerate(dataloader, start=1):
        loss = criterion(model(x), y)
        losses.append(loss.item())
        (loss / accumulation_steps).backward()
        if step % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return float(sum(losses) / len(dataloader))
''',
    "model_zero_grad_and_counter": '''
def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    model.train()
    model.zero_grad()
    seen = 0
    running = 0.0
    for inputs, targets in dataloader:
        loss = criterion(model(inputs), targets)
        running += float(loss.detach())
        (loss / accumulation_steps).backward()
        seen += 1
        if seen == accumulation_steps:
            optimizer.step()
            model.zero_grad()
            seen = 0
    return running / len(dataloader)
''',
    "zero_at_window_start": '''
def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    model.train()
    total = 0.0
    for i, (inputs, targets) in enumerate(dataloader):
        if i % accumulation_steps == 0:
            optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        (loss / accumulation_steps).backward()
        total += loss.item()
        if (i + 1) % accumulation_steps == 0:
            optimizer.step()
    return total / len(dataloader)
''',
    "flush_remainder_divide_by_k": '''
def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    model.train()
    optimizer.zero_grad()
    total = 0.0
    n = len(dataloader)
    for i, (inputs, targets) in enumerate(dataloader):
        loss = criterion(model(inputs), targets)
        (loss / accumulation_steps).backward()
        total += loss.item()
        if (i + 1) % accumulation_steps == 0 or i + 1 == n:
            optimizer.step()
            optimizer.zero_grad()
    return total / n
''',
    "flush_remainder_divide_by_window": '''
def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    model.train()
    optimizer.zero_grad()
    total = 0.0
    n = len(dataloader)
    last_full = n - n % accumulation_steps
    for i, (inputs, targets) in enumerate(dataloader):
        window = accumulation_steps if i < last_full else n - last_full
        loss = criterion(model(inputs), targets)
        (loss / window).backward()
        total += loss.item()
        if (i + 1) % accumulation_steps == 0 or i + 1 == n:
            optimizer.step()
            optimizer.zero_grad()
    return total / n
''',
    "scale_gradients_not_loss": '''
import torch

def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    model.train()
    optimizer.zero_grad()
    total = 0.0
    for i, (inputs, targets) in enumerate(dataloader):
        loss = criterion(model(inputs), targets)
        loss.backward()
        total += loss.item()
        if (i + 1) % accumulation_steps == 0:
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:
                        p.grad /= accumulation_steps
            optimizer.step()
            optimizer.zero_grad()
    return total / len(dataloader)
''',
    "prints_progress": '''
def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    import warnings
    model.train()
    optimizer.zero_grad()
    total = 0.0
    for i, (inputs, targets) in enumerate(dataloader):
        loss = criterion(model(inputs), targets) / accumulation_steps
        loss.backward()
        total += loss.item() * accumulation_steps
        if (i + 1) % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
            print(f"step after batch {i + 1}: loss {loss.item():.3f}")
    warnings.warn("a harmless warning: the test cell must still not write to stderr")
    return total / len(dataloader)
''',
}

_BODY = '''
def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    model.train()
    optimizer.zero_grad()
    total = 0.0
    for i, (inputs, targets) in enumerate(dataloader):
        loss = criterion(model(inputs), targets)
        {backward}
        total += loss.item()
        if {when}:
            optimizer.step()
            {zero}
    return {ret}
'''


def _variant(backward="(loss / accumulation_steps).backward()", when="(i + 1) % accumulation_steps == 0",
             zero="optimizer.zero_grad()", ret="total / len(dataloader)"):
    return _BODY.format(backward=backward, when=when, zero=zero, ret=ret)


WRONG = {
    "no_division_by_k": (_variant(backward="loss.backward()"), ["average gradient", "Final parameters"]),
    "steps_every_batch": (_variant(when="True"), ["Steps once every"]),
    "hard_coded_4": (_variant(when="(i + 1) % 4 == 0"), ["Steps once every"]),
    "hard_coded_divisor": (_variant(backward="(loss / 4).backward()"), ["average gradient"]),
    "never_zeroes_after_step": (_variant(zero="pass"), ["average gradient", "Final parameters"]),
    "off_by_one_window": (_variant(when="i % accumulation_steps == 0"), ["average gradient"]),
    # meant to flush the last, short window; steps after each of its batches instead
    "steps_each_leftover_batch": (_variant(when="(i + 1) % accumulation_steps == 0 or "
                                                "i >= len(dataloader) - len(dataloader) % accumulation_steps"),
                                  ["partial window"]),
    "returns_total_not_mean": (_variant(ret="total"), ["Python float"]),
    "returns_scaled_loss": (_variant(ret="total / len(dataloader) / accumulation_steps"), ["Python float"]),
    "returns_mean_per_step": (_variant(ret="total / (len(dataloader) // accumulation_steps)"), ["Python float"]),
    "zero_grad_every_batch": ('''
def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    model.train()
    total = 0.0
    for i, (inputs, targets) in enumerate(dataloader):
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        (loss / accumulation_steps).backward()
        total += loss.item()
        if (i + 1) % accumulation_steps == 0:
            optimizer.step()
    return total / len(dataloader)
''', ["average gradient"]),
    "forgets_train_mode": ('''
def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    optimizer.zero_grad()
    total = 0.0
    for i, (inputs, targets) in enumerate(dataloader):
        loss = criterion(model(inputs), targets)
        (loss / accumulation_steps).backward()
        total += loss.item()
        if (i + 1) % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    return total / len(dataloader)
''', ["training mode"]),
    "no_initial_zero_grad": ('''
def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    model.train()
    total = 0.0
    for i, (inputs, targets) in enumerate(dataloader):
        loss = criterion(model(inputs), targets)
        (loss / accumulation_steps).backward()
        total += loss.item()
        if (i + 1) % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    return total / len(dataloader)
''', ["left from before"]),
    "sums_loss_tensors": ('''
def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    model.train()
    optimizer.zero_grad()
    total = 0
    for i, (inputs, targets) in enumerate(dataloader):
        loss = criterion(model(inputs), targets)
        (loss / accumulation_steps).backward()
        total += loss
        if (i + 1) % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    return total / len(dataloader)
''', ["Python float", "graph"]),
    "keeps_loss_tensors_in_a_list": ('''
def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    model.train()
    optimizer.zero_grad()
    losses = []
    for i, (inputs, targets) in enumerate(dataloader):
        loss = criterion(model(inputs), targets)
        (loss / accumulation_steps).backward()
        losses.append(loss)
        if (i + 1) % accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    return sum(l.item() for l in losses) / len(dataloader)
''', ["graph"]),
    "own_optimizer": ('''
import torch

def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    total = 0.0
    for i, (inputs, targets) in enumerate(dataloader):
        loss = criterion(model(inputs), targets)
        (loss / accumulation_steps).backward()
        total += loss.item()
        if (i + 1) % accumulation_steps == 0:
            opt.step()
            opt.zero_grad()
    return total / len(dataloader)
''', ["Steps once every", "Final parameters"]),
    "returns_the_printed_constant": ('''
def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    return 1.452745  # what the test cell used to print as "expected" (issue 15: a constant earned a point)
''', EVERY_CHECK),
    "returns_zero": ('''
def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    return 0.0  # trains nothing: the same mistake as any other constant
''', EVERY_CHECK),
    "not_implemented": ('''
def train_with_accumulation(model, dataloader, optimizer, criterion, accumulation_steps=4):
    # YOUR CODE HERE
    raise NotImplementedError()
''', ["Python float", "Final parameters"]),
}
