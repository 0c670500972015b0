"""TEMPLATE variant suite: copy to ``tests/variants/<function name>.py`` for a new exercise (docs/authoring.md).

Submissions for the template exercise `clip_gradients` (autograder/exercises/_template.py). Each entry is the
source of a student's exercise cell, run after the notebook's setup cells. CORRECT: valid styles that must score
full, as different from each other as students' code is. WRONG: plausible mistakes, each naming (by a phrase of
their title) the checks it must fail, or EVERY_CHECK for a submission that must earn nothing (a constant, a
function that does nothing, the blank exercise). tests/exercises/test_variants.py runs them under the public scenarios
(salt 0) and two held-out salts.

A real suite has no REFERENCE: the reference is the solution cell in solutions/. This one names it because
the template exercise lives in no notebook.
"""
from variants import EVERY_CHECK

SETUP = "import torch\n"  # what the notebook's setup cell would hold

REFERENCE = '''
def clip_gradients(model, max_norm):
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
'''

CORRECT = {
    "by_hand": '''
def clip_gradients(model, max_norm):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = sum(float(g.pow(2).sum()) for g in grads) ** 0.5
    if total > max_norm:
        for g in grads:
            g.mul_(max_norm / total)
    return total
''',
    "stacked_norms": '''
def clip_gradients(model, max_norm):
    with torch.no_grad():
        norms = torch.stack([p.grad.norm() for p in model.parameters()])
        total = norms.norm()
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for p in model.parameters():
            p.grad *= scale
    return total.item()
''',
}

WRONG = {
    "never_clips": ('''
def clip_gradients(model, max_norm):
    return float(torch.stack([p.grad.norm() for p in model.parameters()]).norm())
''', ["Clips the gradients"]),
    "clips_each_parameter_separately": ('''
def clip_gradients(model, max_norm):
    total = float(torch.stack([p.grad.norm() for p in model.parameters()]).norm())
    for p in model.parameters():
        torch.nn.utils.clip_grad_norm_([p], max_norm)
    return total
''', ["Clips the gradients"]),
    "scales_the_parameters": ('''
def clip_gradients(model, max_norm):
    total = float(torch.stack([p.grad.norm() for p in model.parameters()]).norm())
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(min(1.0, max_norm / total))
    return total
''', ["Clips the gradients", "parameters alone"]),
    "does_nothing": ('''
def clip_gradients(model, max_norm):
    pass
''', EVERY_CHECK),
    "not_implemented": ('''
def clip_gradients(model, max_norm):
    # YOUR CODE HERE
    raise NotImplementedError()
''', EVERY_CHECK),
}
